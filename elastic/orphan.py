"""Leave with the launcher: a worker or ps shard whose ``elastic-run`` died is orphaned.

Nobody would re-form its rounds or restart its peers, and nobody would reap it. So a
process started by elastic-run watches its parent; when it is re-parented (the driver was
killed, even with SIGKILL), it sends itself SIGTERM, so its own handlers and ``atexit``
still run. (PR_SET_PDEATHSIG would not do: it follows the parent *thread*, and the driver
starts processes from several threads.)
"""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)


def parent_is_gone(original_parent: int, current_parent: int) -> bool:
    """True when the process has been re-parented (pure)."""
    return original_parent > 1 and current_parent != original_parent


def exit_when_orphaned(interval: float = 1.0) -> threading.Event:
    """Start watching the parent; returns an event that stops the watch when set."""
    parent = os.getppid()
    stop = threading.Event()

    def watch():
        while not stop.wait(interval):
            if parent_is_gone(parent, os.getppid()):
                log.error("elastic-run (pid %d) is gone: stopping this process", parent)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()
    return stop
