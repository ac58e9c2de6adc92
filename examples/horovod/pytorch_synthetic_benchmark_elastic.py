"""A synthetic benchmark of elastic PyTorch training, written for Horovod's API and run
by ours: the only line that says which runtime runs it is the import.

    elastic-run -np 2 --min-np 1 python examples/horovod/pytorch_synthetic_benchmark_elastic.py
    elastic-run -np 2 --min-np 1 --chaos-kill-interval 2 \
        python examples/horovod/pytorch_synthetic_benchmark_elastic.py --num-iters 20

It has the shape of Horovod's ``examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py``:
``hvd.init()`` first, an SGD optimizer whose learning rate is scaled by the world size
(and scaled again by a reset callback when the world changes), ``hvd.DistributedOptimizer``
with optional fp16 compression, a ``hvd.elastic.TorchState`` committed every
``--num-batches-per-commit`` batches, warm-up batches, then timed iterations under
``@hvd.elastic.run``. Its model is a small convolutional network of its own on 32x32
images (the original takes one from torchvision), so it runs on a CPU in seconds.

``--record DIR``: each worker writes ``DIR/rank-<rank>.json`` at the end (its world
size, the iterations it timed, a fingerprint of its parameters: equal on every worker,
or training diverged).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import timeit
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import elastic.horovod as hvd


class ConvNet(nn.Module):
    """Two convolutions and a linear layer over 3x32x32 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class MLP(nn.Module):
    """Two hidden layers over the flattened 3x32x32 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)
        )

    def forward(self, x):
        return self.body(x)


MODELS = {"convnet": ConvNet, "mlp": MLP}

parser = argparse.ArgumentParser(
    description="PyTorch synthetic benchmark, elastic",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
)
parser.add_argument(
    "--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce"
)
parser.add_argument("--model", choices=sorted(MODELS), default="convnet", help="model to benchmark")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="warm-up batches, not timed")
parser.add_argument(
    "--num-batches-per-iter", type=int, default=10, help="batches per benchmark iteration"
)
parser.add_argument("--num-iters", type=int, default=10, help="benchmark iterations")
parser.add_argument(
    "--num-batches-per-commit", type=int, default=1, help="batches per commit of the state"
)
parser.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", help="use the Adasum reduction")
parser.add_argument("--record", help="directory where each worker writes what it ended with")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    # Pin each worker to its own GPU on the host.
    torch.cuda.set_device(hvd.local_rank())
# Workers share the host's cores: one thread each.
torch.set_num_threads(1)

model = MODELS[args.model]()


def lr_scaler():
    # Gradients are averaged over the world, so the learning rate grows with it (Adasum
    # needs no scaling).
    return hvd.size() if not args.use_adasum else 1


if args.cuda:
    model.cuda()

lr = 0.01
optimizer = torch.optim.SGD(model.parameters(), lr=lr * lr_scaler())

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)

# The same fake batch for every step.
data = torch.randn(args.batch_size, 3, 32, 32)
target = torch.randint(0, 10, (args.batch_size,))
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step(state):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()

    state.batch += 1
    if state.batch == args.num_batches_per_commit:
        state.batch = 0
        state.commit()  # may raise HostsUpdatedInterrupt: hvd.elastic.run re-forms


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


device = "GPU" if args.cuda else "CPU"
log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of {device}s: {hvd.size()}")


@hvd.elastic.run
def run_benchmark(state):
    # Warm-up: once, whatever re-forms follow.
    if not state.warm:
        log("Running warmup...")
        timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
        state.warm = True
        state.commit()

    if state.iter == 0:
        log("Running benchmark...")
    for x in range(state.iter, args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device} ({hvd.size()} workers)")
        state.img_secs.append(img_sec)
        state.iter = x + 1
        state.commit()


def on_state_reset():
    # The world changed: scale the learning rate to its new size.
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr * lr_scaler()


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)

img_sec_mean = np.mean(state.img_secs)
img_sec_conf = 1.96 * np.std(state.img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(
    f"Total img/sec on {hvd.size()} {device}(s): "
    f"{hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}"
)

if args.record:
    fingerprint = hashlib.sha256()
    for tensor in model.state_dict().values():
        fingerprint.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    Path(args.record, f"rank-{hvd.rank()}.json").write_text(
        json.dumps(
            {
                "rank": hvd.rank(),
                "size": hvd.size(),
                "iters": len(state.img_secs),
                "digest": fingerprint.hexdigest(),
            }
        )
    )
