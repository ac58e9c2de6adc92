"""``exit_process`` and ``run_then_exit`` in real processes: what was buffered comes out,
the status is the one given (or the one Python would give for what ``main`` raised),
and an object whose finalizer waits on a lock a daemon thread holds does not hold the
exit (the hang ``rendezvous.process_exit`` is there for: ``sys.exit`` hangs on it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: a daemon thread holds a lock for good; a garbage cycle's finalizer wants that lock:
#: the interpreter's finalization would collect it and wait forever
HELD_LOCK_AND_A_CYCLE = """
import gc, logging, sys, threading
from rendezvous.process_exit import exit_process, run_then_exit
held, taken = threading.RLock(), threading.Event()
def hold():
    with held:
        taken.set()
        threading.Event().wait()
threading.Thread(target=hold, daemon=True).start()
taken.wait(10)
gc.disable()
class Call:
    def __del__(self):
        with held:
            pass
call = Call()
call.me = call
del call
logging.basicConfig(stream=sys.stderr, format="%(message)s")
logging.getLogger("t").warning("logged")
print("buffered", end="")  # a pipe: block-buffered, not flushed by print
"""


def ends(ending: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HELD_LOCK_AND_A_CYCLE + ending],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_exit_process_flushes_and_exits_with_the_status_past_a_held_lock():
    done = ends("exit_process(7)")
    assert done.returncode == 7, done.stderr
    assert done.stdout == "buffered"
    assert done.stderr.strip() == "logged"


@pytest.mark.parametrize(
    "main, code, said",
    [
        ("lambda: 3", 3, ""),
        ("lambda: None", 0, ""),
        ("lambda: sys.exit(4)", 4, ""),
        ("lambda: sys.exit('no such flag')", 1, "no such flag"),
        ("lambda: 1 / 0", 1, "ZeroDivisionError"),
    ],
)
def test_run_then_exit_gives_the_status_python_would(main, code, said):
    done = ends(f"run_then_exit({main})")
    assert done.returncode == code, done.stderr
    assert done.stdout == "buffered"
    assert said in done.stderr and "logged" in done.stderr
