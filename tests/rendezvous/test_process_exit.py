"""``exit_process``: what was buffered comes out, the status is the one given, and a
daemon thread holding a lock at the end does not hold the process (real processes)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import logging, sys, threading
from rendezvous.process_exit import exit_process
held, taken = threading.RLock(), threading.Event()
def hold():
    with held:
        taken.set()
        threading.Event().wait()
threading.Thread(target=hold, daemon=True).start()
taken.wait(10)
logging.basicConfig(stream=sys.stderr, format="%(message)s")
logging.getLogger("t").warning("logged")
print("buffered", end="")  # a pipe: block-buffered, not flushed by print
exit_process(7)
"""


def test_exit_process_flushes_and_exits_with_the_status():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "buffered"
    assert done.stderr.strip() == "logged"
