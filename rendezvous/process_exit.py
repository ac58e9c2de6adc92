"""How our own programs end: ``exit_process``, without the interpreter's finalization.

The driver, the agents, the ps shards and the standalone store hold gRPC channels whose
completion threads are daemons. When the main thread returns, Python's finalization
stops every daemon thread the moment it next wants the GIL, wherever it is, even
inside ``with call._state.condition``; the garbage collection that follows runs a
leftover call's ``grpc._channel._Rendezvous.__del__``, which takes that condition and
waits forever for a thread that no longer exists. Seen in CI: a driver done with its job
("job done in round 3") hung in that ``__del__`` until the test killed it. Ending with
``os._exit`` once the program's own cleanup is done leaves nothing to finalize: the
work is ours, the files are closed, the children reaped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """Flush what is buffered (the log's handlers, stdout, stderr), then end the process
    with ``code`` at once. Call it last, after the program closed what it opened."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # none, closed, gone
            stream.flush()
    os._exit(code)
