"""How our own programs end: ``exit_process``, without the interpreter's finalization.

The driver, the agents, the ps shards, the standalone store and a restart-mode
worker's entry (until it becomes the program) hold gRPC channels whose
completion threads are daemons. When the main thread returns, Python's finalization
stops every daemon thread the moment it next wants the GIL, wherever it is, even
inside ``with call._state.condition``; the garbage collection that follows runs a
leftover call's ``grpc._channel._Rendezvous.__del__``, which takes that condition and
waits forever for a thread that no longer exists. Seen in CI: a driver done with its job
("job done in round 3") hung in that ``__del__`` until the test killed it. Ending with
``os._exit`` once the program's own cleanup is done leaves nothing to finalize: the
work is ours, the files are closed, the children reaped. What it skips: the
``atexit`` hooks (a library's own, like Ray's disconnect, are called by the program
before: ``driver.hosts.ray``), and the wait for executor threads stopped without
waiting (a ps shard's checkpoint write past its caller's deadline is cut short; it
writes to a temporary file and renames it, so no checkpoint is ever half written).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from typing import Callable, NoReturn


def exit_process(code: int) -> NoReturn:
    """Flush what is buffered (the log's handlers, stdout, stderr), then end the process
    with ``code`` at once. Call it last, after the program closed what it opened."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # none, closed, gone
            stream.flush()
    os._exit(code)


def run_then_exit(main: Callable[[], int | None]) -> NoReturn:
    """``exit_process`` with what ``main()`` returns, and also when it raises: a
    ``SystemExit`` with its own status (a message: printed, status 1), Ctrl-C 130, any
    other exception its traceback and 1, as Python itself would say them."""
    try:
        code = main() or 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001  (said whole, as the interpreter would)
        traceback.print_exc()
        code = 1
    exit_process(code)
