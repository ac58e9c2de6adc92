"""The parameter-server shards under the driver (``--num-ps``): their start, watch and
restart (``supervisor``), and the hosts they run on (``shard_hosts``)."""
