"""The shard's side of the parameter servers (one process per shard; started as
``python -m elastic.ps.server``)."""
