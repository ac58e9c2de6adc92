"""The exceptions of ``elastic.horovod``: Horovod's two elastic signals, which are our
runtime's own, and the one error of the adapter itself.

Horovod's ``HorovodInternalError`` (a collective failed: a worker was lost) is what our
runtime calls ``WorkerLostError``, and its ``HostsUpdatedInterrupt`` (the hosts changed:
re-form at the next commit) is ours by the same name. They are the same classes, not
look-alikes, so ``except hvd.HorovodInternalError`` catches what our collectives raise
and ``@hvd.elastic.run`` handles what a script raises.
"""

from __future__ import annotations

from elastic.errors import ElasticError, HostsUpdatedInterrupt, WorkerLostError

#: a collective failed because a worker of the round was lost (or the round is
#: re-forming): ``@hvd.elastic.run`` rolls back to the last commit and goes on
HorovodInternalError = WorkerLostError


class HorovodUnsupportedError(ElasticError, NotImplementedError):
    """A part of Horovod's API that this adapter does not map (``hvd.Adasum``,
    ``hvd.Product``, a custom ``Compressor`` in ``DistributedOptimizer``, sparse
    gradients, ``hvd.init(comm=...)``): the message names it and what to use instead.
    A ``NotImplementedError``, so code that probes for optional features catches it."""


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "HorovodUnsupportedError"]
