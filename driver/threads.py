"""The driver's one way to start a helper thread (named, daemon, started at once), and
the one lock around its terminal (``WRITE_LOCK``).

Every thread the driver starts besides its main loop (store watches, the store's probe,
discovery polls, waits for a process to exit, stops, host probes, the ps shards' start)
is a daemon: the main loop ends the job and reaps the processes itself, and a helper
stuck in a blocking call must not keep the driver alive after that.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def spawn(name: str, target: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
    """Run ``target(*args, **kwargs)`` in a new daemon thread called ``name``."""
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
    thread.start()
    return thread


WRITE_LOCK = threading.Lock()
"""Held around every write of a whole line to the driver's stdout/stderr: the workers'
forwarded output (``driver.launch.output``) and the event log's lines
(``driver.events.log``), so neither ever splits the other's line."""
