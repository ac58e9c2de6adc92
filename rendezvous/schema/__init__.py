"""The records that travel through the store, one module per subsystem. Every record
is written with ``to_json`` and read with ``from_json``, never as a bare dict, so
writers and readers share one schema; the keys they live under are
``rendezvous.keys.JobKeys``.

- ``record``: ``JsonRecord``, the encoding they share (unknown fields are ignored);
- ``rounds``: the driver's plans (``Plan``, ``Member``) and how a worker takes one;
- ``workers``: what workers write for the driver (registration, failure reports,
  progress, the end of training);
- ``snapshots``: the workers' snapshots (``elastic.snapshots``);
- ``agents``: the per-host agents and the processes the leader assigns them;
- ``leader``: the driver that leads the job and the state a successor takes over;
- ``worlds``: restart mode's worlds (rank 0's c10d store, a warm spare's seat);
- ``ps``: the parameter-server shards and their checkpoints.
"""
