"""One worker of ``benchmarks/torch_bench.py``: trains a model data-parallel, either with
``elastic.torch.DistributedOptimizer`` (started by elastic-run) or with PyTorch DDP on
gloo (started by the benchmark), on command from the benchmark's control connection.

Commands (JSON lines): ``{"cmd": "run", "steps": K}`` runs a barrier then K training
steps and answers ``{"seconds": wall time of the K steps, "hidden": [share of each
step's communication hidden behind backward (ours only)]}``; ``{"cmd": "exit"}``.

    torch_train.py --impl ours --control HOST:PORT --model mlp --batch 8
    torch_train.py --impl ddp --control HOST:PORT --rank R --world N --port P ...

``--device cuda`` trains on the GPU (ours: the plane ``ELASTIC_TORCH_BACKEND`` picks;
DDP: ``--ddp-backend nccl``); ``--nccl-hostid-per-worker`` gives each worker its own
``NCCL_HOSTID`` so that NCCL takes several ranks on one GPU (a trick for tests and
benchmarks only: ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
from torch import nn

from benchmarks.harness.control import Line


def build_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The model and the shape of one input sample."""
    torch.manual_seed(0)
    if name == "mlp":  # about 25M parameters in 8 layers: communication-heavy
        layers: list[nn.Module] = [nn.Linear(1024, 2048), nn.ReLU()]
        for _ in range(5):
            layers += [nn.Linear(2048, 2048), nn.ReLU()]
        layers += [nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10)]
        return nn.Sequential(*layers), (1024,)
    if name == "cnn":  # about 1.2M parameters, more compute per byte of gradient
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(256 * 4 * 4, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        ), (3, 32, 32)
    raise ValueError(f"unknown model {name!r}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["ours", "ddp"], required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ddp-backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--nccl-hostid-per-worker", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.nccl_hostid_per_worker:  # several NCCL ranks on one GPU: benchmarks only
        os.environ["NCCL_HOSTID"] = f"rank{args.rank}-{os.getpid()}"
    device = torch.device(args.device)

    model, sample = build_model(args.model)
    model = model.to(device)
    timeline = None
    if args.impl == "ours":
        import elastic
        import elastic.torch as et

        et.init()
        rank = elastic.rank()
        distributed = et.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
        )
        optimizer: torch.optim.Optimizer = distributed
        et.broadcast_parameters(model.state_dict(), root_rank=0)
        net, barrier = model, elastic.barrier

        def timeline():
            return distributed.last_timeline
    else:
        import torch.distributed as dist

        dist.init_process_group(
            args.ddp_backend,
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=args.rank,
            world_size=args.world,
        )
        rank = args.rank
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index or 0] if device.type == "cuda" else None
        )
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
        barrier = dist.barrier

    host, port = args.control.rsplit(":", 1)
    ctl = Line(socket.create_connection((host, int(port)), timeout=120))
    ctl.sock.settimeout(None)
    ctl.send({"rank": rank})
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, *sample, generator=generator).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=generator).to(device)
    loss_fn = nn.CrossEntropyLoss()
    while True:
        msg = ctl.recv()
        if msg["cmd"] == "exit":
            break
        hidden = []
        barrier()
        started = time.perf_counter()
        for _ in range(msg["steps"]):
            optimizer.zero_grad()
            loss_fn(net(x), y).backward()
            optimizer.step()
            if timeline is not None and timeline() is not None:
                share = timeline().hidden_fraction()
                if share is not None:
                    hidden.append(share)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the steps' kernels are done, not only queued
        ctl.send({"seconds": time.perf_counter() - started, "hidden": hidden})
    if args.impl == "ours":
        elastic.shutdown()
    else:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
