"""The torchrun peer of ``steps.py``: a data-parallel loop with gloo that checkpoints
every step and resumes from the checkpoint when torchrun restarts the worker group.

Each step: the same kind of compute as ``steps.py`` (a matrix product), forward and
backward of a small linear model, one gloo allreduce of the flattened gradients (plus
a stop flag), the SGD step; then rank 0 writes ``{model, optimizer, step}`` with
``torch.save`` to a temp file and renames it over ``OUT_DIR/ckpt.pt`` (atomic against a
crash of the process, which is the failure measured here; no fsync, as ours keeps its
commits in memory). Every rank then appends a JSON line to its own file,
``OUT_DIR/torch-g<restart>-rank<rank>-<host name>-<pid>.commits``:

    {"ev": "commit", "t": <time.time()>, "rank": ..., "size": ..., "round": <restart>,
     "group": <group id>, "step": ...}

plus ``{"ev": "start", ...}`` before torch is imported (when the process began running
the script; with its host name and pid), ``{"ev": "imported", ...}`` once torch is
imported and the model and optimizer are built, ``{"ev": "ready", ...}`` once the process
group is up and the checkpoint loaded, so a benchmark can tell where a restart spends
its time, and ``{"ev": "failed", ...}`` when a collective raised (a gloo timeout, a lost
peer; the process then exits with the error). The restart count comes from torchrun
(``TORCHELASTIC_RESTART_COUNT``) and plays the part of ours' round number on one node;
across nodes each agent counts its own restarts (and a restart for a node that joins
is not counted), so the group id tells groups apart: rank 0's ``time.time()`` when the
group came up, broadcast to every rank (a later group has a larger id). ``--timeout``
is the gloo timeout in seconds (torch's default when not given). The job ends when
``OUT_DIR/stop`` exists (agreed through the allreduce, so all ranks leave on the same
step and exit 0).

Benchmarks only: torch is never a dependency of the project.

    torchrun --nproc-per-node=N ... torch_steps.py OUT_DIR [--work K] [--timeout SEC]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--work", type=int, default=160)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=None, help="gloo timeout, seconds")
    args = parser.parse_args()

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host = socket.gethostname()
    name = f"torch-g{restart}-rank{rank}-{host}-{os.getpid()}.commits"
    # Open for the life of the process: a worker may be SIGKILLed at any line.
    log = open(os.path.join(args.out_dir, name), "a", buffering=1)  # noqa: SIM115

    def record(ev: str, **fields) -> None:
        log.write(json.dumps({"ev": ev, "t": time.time(), **fields}) + "\n")

    record("start", pid=os.getpid(), host=host, rank=rank, round=restart)

    import torch  # only here: the project itself never imports torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(args.dim, 16)
    # The first optimizer pulls in torch._dynamo (about as slow as importing torch):
    # part of what every restarted process pays, so it is inside "imported".
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    record("imported", rank=rank, round=restart)

    if args.timeout is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    stamp = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(stamp, 0)
    group = stamp.item()
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt_path):
        saved = torch.load(ckpt_path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    record("ready", rank=rank, size=world, host=host, round=restart, group=group, step=step)

    generator = torch.Generator().manual_seed(1)
    features = torch.randn(args.samples, args.dim, generator=generator)
    a = torch.randn(args.work, args.work, generator=generator)
    stop_path = os.path.join(args.out_dir, "stop")
    params = list(model.parameters())

    def grad_of(p: torch.Tensor) -> torch.Tensor:
        assert p.grad is not None, "backward() gives every parameter a gradient"
        return p.grad

    while True:
        a @ a  # stands in for the rest of a forward/backward pass
        lo = ((step * world + rank) * args.batch) % (args.samples - args.batch)
        loss = model(features[lo : lo + args.batch]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        flat = torch.cat(
            [grad_of(p).reshape(-1) for p in params]
            + [torch.tensor([1.0 if os.path.exists(stop_path) else 0.0])]
        )
        try:
            dist.all_reduce(flat)
        except RuntimeError as exc:  # gloo's errors (DistBackendError is one)
            record("failed", rank=rank, group=group, error=str(exc)[:200])
            raise
        offset = 0
        for p in params:
            n = p.numel()
            grad_of(p).copy_(flat[offset : offset + n].reshape(p.shape) / world)
            offset += n
        optimizer.step()
        step += 1
        if rank == 0:
            tmp = f"{ckpt_path}.tmp"
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                tmp,
            )
            os.replace(tmp, ckpt_path)
        record("commit", rank=rank, size=world, round=restart, group=group, step=step)
        if flat[-1].item() > 0:
            break
    dist.destroy_process_group()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
