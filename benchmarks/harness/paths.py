"""Where the benchmarks' files are (one place)."""

from __future__ import annotations

from pathlib import Path

#: the repository's root (the project's packages, examples/ and benchmarks/ are there)
ROOT = Path(__file__).resolve().parent.parent.parent
#: the scripts the benchmarks run as workers
WORKLOADS = ROOT / "benchmarks" / "workloads"
#: ours: a training loop that logs the wall-clock time of every commit
STEPS = WORKLOADS / "steps.py"
#: torchrun's: the same loop on torch.distributed
TORCH_STEPS = WORKLOADS / "torch_steps.py"
