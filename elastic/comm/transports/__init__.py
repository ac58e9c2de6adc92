"""How a round's collective bytes move: the ``Transport`` interface (``base``) and its
implementations, agreed by every member during setup (``selection``).

* ``shm``: shared memory, when every member is on this host (the ring's connections then
  only carry failure signals);
* ``hier``: shared memory inside each host (``host_group``) and a TCP ring among one
  leader per host (``tcp_ring``), when members share some hosts but not all; a leader's
  network steps may run on a thread of their own (``overlap``) when its host has a CPU
  for it (``cpus``);
* ``tcp_ring``: a pipelined ring over the data connections, when no two members share
  a host.

Which members share a machine, and so which transport a placement calls for, is
``topology`` (pure). Every transport raises the same internal errors (``base``:
``Interrupted``, ``Mismatch``, ``PeerGone``), which the communicator
(``elastic.comm.ring``) turns into the public ones.
"""
