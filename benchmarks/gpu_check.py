"""``elastic.torch``'s data planes on this machine, one JSON line per check: on a GPU,
the NCCL plane; without one, what a CPU can check of the same plane (gloo).

    python benchmarks/gpu_check.py [--models mlp cnn] [--world 2] [--blocks 3]
        [--steps 10] [--skip-steps]

Finishes in under 8 minutes on one GPU. The lines, in order:

- ``{"check": "gpu", "available", "devices", "name", "torch", "nccl", "note"}``: what
  the machine has (without a GPU the note says that only the CPU lines follow);
- ``{"check": "collective", "plane", "name", "ok", ...}``: every collective and state
  broadcast of ``tests/support/workloads/torch_checks.py`` on the plane under test (NCCL
  on CUDA tensors; gloo on CPU), compared with the same checks on the CPU ring; and
  training equal to one process (``max_diff``);
- ``{"check": "kill_recovery", "plane", "world", "kill_to_raise_s", "kill_to_next_step_s"}``:
  three workers, one SIGKILLed in the middle of a step's allreduce: each survivor's
  time from the kill to its ``WorkerLostError`` and to the end of its first step in the
  next round (which forms the new round's group);
- ``{"check": "shrink", "mode": "rebuild"|"shrink", "recover_s"}`` (GPU only): a hung
  NCCL allreduce after a member's SIGKILL, ended by ``abort()`` and a new group, or by
  ``ncclCommShrink`` (NCCL 2.27+);
- ``{"check": "steps_per_s", "model", "world", "device", "steps_per_s": {...},
  "ratio_ours_ddp"}``: training steps per second of ours on the plane, ours on the
  ring (CUDA tensors staged through host memory on a GPU), and DDP (NCCL on a GPU, gloo
  on a CPU), interleaved in blocks (``torch_bench.Group``).

Several ranks on the one GPU: NCCL refuses two ranks of one host on one device, so each
worker gets its own ``NCCL_HOSTID`` -- a trick for tests and benchmarks only (a real job
has one GPU per rank); the ranks then share the GPU's time, so the steps per second say
how ours compares with DDP, not what one GPU per rank would do. Where NCCL still refuses,
the lines say so and a world of one runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by path (``python benchmarks/gpu_check.py``, the command a lent GPU machine is
    # given): run again as the module, with the repository on the import path.
    _root = str(Path(__file__).resolve().parent.parent)
    _path = os.pathsep.join(filter(None, [_root, os.environ.get("PYTHONPATH")]))
    os.execve(
        sys.executable,
        [sys.executable, "-m", "benchmarks.gpu_check", *sys.argv[1:]],
        {**os.environ, "PYTHONPATH": _path},
    )

from benchmarks.harness.jobs import ElasticRun
from benchmarks.harness.paths import ROOT
from benchmarks.harness.processes import free_port
from benchmarks.harness.torch_groups import Group, parameters_m

CHECKS = ROOT / "tests" / "support" / "workloads" / "torch_checks.py"
SHRINK = ROOT / "benchmarks" / "workloads" / "nccl_shrink.py"
#: each check's collectives, compared between the plane under test and the CPU ring
COMPARED = ("collectives", "broadcasts", "state")
TRAINING = {"sgd": 1e-9, "accumulate": 1e-9, "adam": 1e-9, "fp16": 1e-3}


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


def machine() -> dict:
    import torch
    import torch.distributed as dist

    available = torch.cuda.is_available()
    nccl = None
    if available and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {
        "check": "gpu",
        "available": available,
        "devices": torch.cuda.device_count() if available else 0,
        "name": torch.cuda.get_device_name(0) if available else None,
        "torch": torch.__version__,
        "nccl": nccl,
        "note": (
            "several ranks share the GPU through per-rank NCCL_HOSTID (tests only)"
            if available
            else "no GPU: nothing ran on NCCL; the lines below check the same plane on "
            "CPU with gloo"
        ),
    }


def run_checks(workdir: Path, np: int, env: dict, args: list[str], timeout: float) -> list[dict]:
    """torch_checks.py under elastic-run; every worker's result (raises when it fails)."""
    out = workdir / "out"
    out.mkdir(parents=True)
    with ElasticRun(
        ["-np", str(np), "python", str(CHECKS), str(out), *args], workdir, env=env
    ) as run:
        if run.wait(timeout=timeout) != 0:
            raise RuntimeError(f"torch_checks failed: {run.stderr_tail(12)}")
    found = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    return sorted(found, key=lambda r: r["rank"])


def check_collectives(work: Path, plane: str, device_args: list[str]) -> None:
    reference = run_checks(
        work / "ring", 2, {"ELASTIC_TORCH_BACKEND": "ring"}, ["collectives"], 150
    )
    subject = run_checks(
        work / plane, 2, {"ELASTIC_TORCH_BACKEND": plane}, ["collectives", *device_args], 150
    )
    for ref, got in zip(reference, subject):
        for part in COMPARED:
            for name, want in ref[part].items():
                emit(
                    {
                        "check": "collective",
                        "plane": got["plane"],
                        "rank": got["rank"],
                        "name": f"{part}.{name}",
                        "ok": got[part][name] == want,
                        **(
                            {}
                            if got[part][name] == want
                            else {"got": got[part][name], "want": want}
                        ),
                    }
                )
        for case, tolerance in TRAINING.items():
            diff = got[case]["max_diff"]
            emit(
                {
                    "check": "collective",
                    "plane": got["plane"],
                    "rank": got["rank"],
                    "name": f"training.{case}",
                    "ok": diff <= tolerance and got[case]["identical_every_step"],
                    "max_diff": diff,
                }
            )


def check_kill(work: Path, plane: str, device_args: list[str]) -> None:
    out = work / "out"
    out.mkdir(parents=True)
    flag = work / "kill-once"
    flag.write_text("")
    argv = ["-np", "3", "--min-np", "2", "python", str(CHECKS), str(out), "train"]
    argv += ["--steps", "40", "--kill-flag", str(flag), "--kill-at", "5", *device_args]
    with ElasticRun(argv, work, env={"ELASTIC_TORCH_BACKEND": plane}) as run:
        if run.wait(timeout=180) != 0:
            raise RuntimeError(f"the job failed: {run.stderr_tail(12)}")
    killed = float((out / "killed-at").read_text())
    raised = sorted(float(p.read_text()) - killed for p in out.glob("lost-at-*"))
    trained = sorted(float(p.read_text()) - killed for p in out.glob("recovered-at-*"))
    final = [json.loads(p.read_text()) for p in out.glob("*.json")]
    emit(
        {
            "check": "kill_recovery",
            "plane": plane,
            "world": 3,
            "kill_to_raise_s": [round(t, 3) for t in raised],
            "kill_to_next_step_s": [round(t, 3) for t in trained],
            "exact": all(r["max_diff"] < 1e-9 for r in final),
        }
    )


def check_shrink() -> None:
    for mode in ("rebuild", "shrink"):
        port = free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(SHRINK),
                    "--rank",
                    str(r),
                    "--port",
                    str(port),
                    "--mode",
                    mode,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for r in range(3)
        ]
        lines = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=120)
                lines += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        times = [x["recover_s"] for x in lines if "recover_s" in x]
        errors = [x["error"] for x in lines if "error" in x]
        emit(
            {
                "check": "shrink",
                "mode": mode,
                "recover_s": round(max(times), 3) if len(times) == 2 else None,
                "correct": all(x.get("correct") for x in lines) if lines else None,
                **({"errors": errors} if errors or len(times) != 2 else {}),
            }
        )


def check_steps(model: str, world: int, device: str, blocks: int, steps: int) -> None:
    """Ours on the plane and on the ring against DDP, interleaved (``torch_bench``)."""
    gpu = device == "cuda"
    plane = "nccl" if gpu else "gloo"
    extra = ["--device", device] + (["--nccl-hostid-per-worker"] if gpu else [])
    batch = 8 if model == "cnn" else 2
    groups = {
        "ours_" + plane: Group(
            "ours", model, world, batch, extra, {"ELASTIC_TORCH_BACKEND": plane}
        ),
        "ours_ring": Group("ours", model, world, batch, extra, {"ELASTIC_TORCH_BACKEND": "ring"}),
        "ddp_" + plane: Group("ddp", model, world, batch, [*extra, "--ddp-backend", plane]),
    }
    times: dict[str, list[float]] = {name: [] for name in groups}
    try:
        for block in range(blocks + 1):
            names = list(groups) if block % 2 == 0 else list(reversed(groups))
            for name in names:
                seconds, _ = groups[name].run(steps)
                if block > 0:  # block 0 warms up
                    times[name].append(seconds)
    finally:
        for group in groups.values():
            group.close()
    rates = {name: round(steps / statistics.median(ts), 2) for name, ts in times.items()}
    emit(
        {
            "check": "steps_per_s",
            "model": model,
            "params_m": parameters_m(model),
            "world": world,
            "device": device,
            "batch_per_worker": batch,
            "steps_per_s": rates,
            "ratio_ours_ddp": round(rates["ours_" + plane] / rates["ddp_" + plane], 2),
            "load_avg": round(os.getloadavg()[0], 2),
        }
    )


def guarded(name: str, fn, *args) -> None:
    """Run one check; a failure is its line (``error``), and the next check runs."""
    started = time.monotonic()
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported as a line: the script goes on
        emit({"check": name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    finally:
        print(f"# {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-steps", action="store_true", help="no steps/s lines")
    args = parser.parse_args()
    info = machine()
    emit(info)
    gpu = bool(info["available"])
    plane = "nccl" if gpu else "gloo"
    device_args = ["--device", "cuda", "--nccl-hostid-per-worker"] if gpu else []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        guarded("collective", check_collectives, work / "collectives", plane, device_args)
        guarded("kill_recovery", check_kill, work / "kill", plane, device_args)
        if gpu:
            guarded("shrink", check_shrink)
        if not args.skip_steps:
            for model in args.models:
                device = "cuda" if gpu else "cpu"
                guarded(
                    "steps_per_s", check_steps, model, args.world, device, args.blocks, args.steps
                )


if __name__ == "__main__":
    main()
