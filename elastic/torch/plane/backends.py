"""The process-group backends a round's group runs on, chosen by name (``BACKENDS``):
how each is built, how a thread waits for one of its collectives so that an abort from
another thread ends the wait, and how it is aborted.

- gloo: ``ProcessGroupGloo`` bound to the worker's data-plane address (the address its
  ring peers reach, whatever the host name resolves to). Its ``abort()`` does not end a
  collective that waits on a peer (torch 2.13), so the wait is on the collective *or*
  the group's abort, whichever comes first: ``Work.wait`` in slices of ``WAIT_SLICE``
  (it returns the moment the collective ends; between slices the abort is looked at).
  Not a done-callback on the collective's future: that is Python run from gloo's
  thread whenever the collective ends, and an abandoned collective can end at any
  time, even while the interpreter shuts down (seen: a SIGSEGV in
  ``PyThreadState_New`` at a survivor's exit). The abandoned collective ends by
  itself once a peer's sockets close (a dead process's at once), or at ``op_timeout``,
  the last resort. It only ever touches buffers of the group it ran in
  (``RoundGroup``), so nothing of a later round. An aborted gloo group is never freed:
  torch's destructor waits for its collectives holding the GIL (which their ends need),
  and freeing one whose peer died can end the process (gloo throws in a destructor).
  Each round so leaves its group's sockets and threads behind (a few per round: fine
  for the CPU plane's jobs, which are tests and small runs; NCCL's groups are freed).
- nccl: ``ProcessGroupNCCL`` with non-blocking communicators (``config.blocking = 0``),
  so that ``abort()`` (``ncclCommAbort``) from the abort thread ends a kernel that waits
  on a lost rank; the waiting thread sees the kernel end and raises. torch's own
  watchdog is told not to handle errors (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` unless
  the user set it): it would tear the process down on a peer's loss, which is ours to
  handle. GPU only: exercised by ``benchmarks/gpu_check.py``, never by the CPU tests.
"""

from __future__ import annotations

import abc
import ctypes
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupSettings:
    """connect_timeout: seconds a group may take to form (its rendezvous).
    op_timeout: torch's own timeout of one collective: the last resort when nothing else
        ends it (a failure is normally seen by the ring within milliseconds).
    bind_host: the address gloo binds (the worker's data-plane listener's host)."""

    connect_timeout: float = 30.0
    op_timeout: float = 120.0
    bind_host: str = "127.0.0.1"

    def __post_init__(self):
        if not (self.connect_timeout > 0 and self.op_timeout > 0):
            raise ValueError("connect_timeout and op_timeout must be > 0")


#: how often a gloo collective's wait looks at the group's abort (the most an abort
#: adds to a survivor's time to raise; a finished collective ends the wait at once)
WAIT_SLICE = 0.02


class GroupBackend(abc.ABC):
    """One kind of process group (see the module docstring)."""

    name: str

    @abc.abstractmethod
    def create(
        self, store: dist.Store, rank: int, size: int, settings: GroupSettings
    ) -> dist.ProcessGroup:
        """A connected group of ``size`` members (blocks until all are in).

        Raises RuntimeError (torch's) when it cannot form."""

    @abc.abstractmethod
    def wait(self, work: dist.Work, aborted: threading.Event, timeout: float) -> bool:
        """Block until ``work`` finished (True: its result stands, even if the group was
        aborted since) or the group is aborted first (False), at most ``timeout``
        seconds (False). Raises what the collective raised."""

    def device(self) -> torch.device:
        """Where the group's tensors live."""
        return torch.device("cpu")

    def abort(self, group: dist.ProcessGroup) -> None:
        """End ``group``'s communication now (any thread; idempotent)."""
        group.abort()


class GlooBackend(GroupBackend):
    name = "gloo"

    def create(self, store, rank, size, settings):
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timedelta(seconds=settings.op_timeout)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=settings.bind_host)]
        return dist.ProcessGroupGloo(store, rank, size, options)

    def abort(self, group: dist.ProcessGroup) -> None:
        group.abort()
        _never_free(group)

    def wait(self, work, aborted, timeout):
        # A finished collective is the round's result even when the round ended since
        # (a peer that finished its last step and exited closes the ring at once): only
        # one still waiting is cut short.
        deadline = time.monotonic() + timeout
        while True:
            if work.is_completed():  # its own outcome: raises the collective's error
                work.wait()
                return True
            left = deadline - time.monotonic()
            if aborted.is_set() or left <= 0:
                return False
            try:
                work.wait(timedelta(seconds=min(WAIT_SLICE, left)))
                return True
            except RuntimeError:  # torch's "timed out" for a slice, or the collective's error
                continue  # (a failed collective is complete: raised above)


class NcclBackend(GroupBackend):
    name = "nccl"

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def create(self, store, rank, size, settings):
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=settings.op_timeout)
        if hasattr(options, "config"):
            options.config.blocking = 0  # non-blocking communicators: abortable
        else:  # pragma: no cover - an NCCL build without the config struct
            os.environ.setdefault("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")
        group = dist.ProcessGroupNCCL(store, rank, size, options)
        # Form the communicator now (its cost belongs to the round's start, and an abort
        # can end it), not inside the round's first collective.
        group.eager_connect_single_device(self.device())
        return group

    def wait(self, work, aborted, timeout):
        work.wait()  # the current stream waits for NCCL's
        finished = torch.cuda.Event()
        finished.record()
        # ``abort()`` ends a kernel stuck on a lost rank, so this sync returns then too.
        finished.synchronize()
        return not aborted.is_set()


def _never_free(obj: object) -> None:
    """One reference more than anything will drop: the object outlives the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


#: the backends by name (``elastic.torch.plane.choice``'s "gloo" and "nccl")
BACKENDS: dict[str, type[GroupBackend]] = {"gloo": GlooBackend, "nccl": NcclBackend}
