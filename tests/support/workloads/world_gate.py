"""A program of restart mode's worlds (``elastic-run --restart-workers``) without torch,
for the tests of the worlds themselves: it records what it was told, then holds until
the test opens a gate.

    world_gate.py OUT_DIR

It writes ``OUT_DIR/w<TORCHELASTIC_RESTART_COUNT>-r<RANK>-<pid>.json`` (the torchrun
variables and any ``ELASTIC_*`` it sees, with its pid), then exits 0 once
``OUT_DIR/done`` exists, or 3 if it does not within 120 s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

SHOWN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
)
DEADLINE = 120.0


def main() -> int:
    out = Path(sys.argv[1])
    seen = {k: v for k, v in os.environ.items() if k in SHOWN or k.startswith("ELASTIC_")}
    name = f"w{seen.get('TORCHELASTIC_RESTART_COUNT')}-r{seen.get('RANK')}-{os.getpid()}.json"
    partial = out / (name + ".partial")
    partial.write_text(json.dumps({"pid": os.getpid(), "env": seen}))
    partial.replace(out / name)  # whole: a test reading the folder never sees half of it
    deadline = time.monotonic() + DEADLINE
    while not (out / "done").exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.02)  # the gate is a file the test makes: polled, with a deadline
    return 0


if __name__ == "__main__":
    sys.exit(main())
