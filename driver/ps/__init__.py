"""The parameter-server shards under the driver (``--num-ps``): their start, watch,
restart and failover to a backup (``supervisor``), their command line (``command``),
what they say in the store (``records``), and when a backup takes a shard over
(``failover``). Where they run is a hosts question: ``driver.hosts.shard_placement``."""
