"""The shard's side of the parameter servers (one process per shard, and with
``--ps-replicas 1`` one more as its backup; started as ``python -m ps.server``)."""
