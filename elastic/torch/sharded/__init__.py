"""Sharded models (FSDP2) on the job's world, resharded in place at every round.

- ``fsdp``: ``fully_shard`` on the current round's mesh; ``recut`` onto a new one;
- ``group``: the round's process group as FSDP2 takes one, with waits that end when
  the round does;
- ``parts``: a state's sharded objects: commits kept and mirrored, adopted by a sync;
- ``layout``: the sync's decisions, pure;
- ``mirror``: a worker's committed part in another worker's host memory.

``elastic.torch`` imports this package on the first ``fully_shard``: FSDP2's own import
takes 1.5 s, which a replicated job should not pay.
"""
