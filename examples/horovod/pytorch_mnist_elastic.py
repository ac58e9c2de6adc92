"""Elastic training of a small CNN on the handwritten digits, written for Horovod's API
and run by ours: the only line that says which runtime runs it is the import.

    elastic-run -np 2 --min-np 1 python examples/horovod/pytorch_mnist_elastic.py
    elastic-run -np 2 --min-np 1 --chaos-kill-interval 2 \
        python examples/horovod/pytorch_mnist_elastic.py

It has the shape of Horovod's ``examples/elastic/pytorch/pytorch_mnist_elastic.py``, on
the 8x8 digits shipped in ``examples/data`` instead of MNIST (no download):
``hvd.init()`` first, ``DistributedSampler``s built with the first world's size and
rank, a learning rate scaled by ``hvd.size()`` (again by a reset callback when the world
changes), ``hvd.DistributedOptimizer``, ``hvd.elastic.TorchState(model, optimizer,
epoch=1, batch=0)`` committed after every batch, and metrics averaged with
``hvd.allreduce(tensor, name=...)``.

Two things here are Horovod's habits, kept to show that they work as they do under
Horovod, and not what an elastic script should do (the README's "Coming from Horovod"
says what instead):

* The samplers keep the first world's size and rank for the whole job, so once the
  world changes, workers may train on the same part of the data and leave another out.
  ``hvd.elastic.ElasticSampler`` in the state splits what is left of each epoch among
  the current world.
* The learning rate follows ``hvd.size()``, so the step size changes with the world.

One thing differs from the published example: the test pass runs inside
``@hvd.elastic.run``, at the end of each epoch. The published one calls it after
training, outside, where a worker lost during its allreduce ends the job.

``--record DIR``: each worker writes ``DIR/rank-<rank>.json`` at the end (its world
size, its test accuracy, a fingerprint of its parameters: equal on every worker, or
training diverged).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import elastic.horovod as hvd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_digits import load_digits  # the shipped digits and their train/test split

parser = argparse.ArgumentParser(description="PyTorch digits example, elastic")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
parser.add_argument(
    "--test-batch-size", type=int, default=1000, help="input batch size for testing"
)
parser.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one worker")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
parser.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10, help="batches between log lines")
parser.add_argument(
    "--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce"
)
parser.add_argument("--use-adasum", action="store_true", help="use the Adasum reduction")
parser.add_argument("--record", help="directory where each worker writes what it ended with")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.manual_seed(args.seed)

if args.cuda:
    # Pin each worker to its own GPU on the host.
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)

# Workers share the host's cores: one thread each.
torch.set_num_threads(1)

train_x, train_y, test_x, test_y = (torch.from_numpy(a) for a in load_digits())
train_dataset = TensorDataset(train_x.float().view(-1, 1, 8, 8), train_y)
test_dataset = TensorDataset(test_x.float().view(-1, 1, 8, 8), test_y)
# Horovod's habit: partition the data by the first world's size and rank.
train_sampler: DistributedSampler = DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
)
train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
test_sampler: DistributedSampler = DistributedSampler(
    test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
)
test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=3, padding=1)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(80, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))  # 10 x 4 x 4
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))  # 20 x 2 x 2
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()

# Averaged gradients: the learning rate grows with the world (Adasum needs no scaling).
lr_scaler = hvd.size() if not args.use_adasum else 1

if args.cuda:
    model.cuda()
    # With Adasum on GPUs, scale by the GPUs of one host.
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(1)
            test_accuracy += pred.eq(target).float().sum().item()

    # Each worker's share of the test set, then the mean over the workers.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")

    if hvd.rank() == 0:
        print(
            f"Test set: average loss {test_loss:.4f}, accuracy {100.0 * test_accuracy:.2f}% "
            f"({hvd.size()} workers)",
            flush=True,
        )


@hvd.elastic.run
def train(state):
    # Runs again from the last commit after every re-form.
    for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020 - resumes the epoch
        state.model.train()

        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch

        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break

            if args.cuda:
                data, target = data.cuda(), target.cuda()
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                print(
                    f"Train epoch {state.epoch} [{state.batch * len(data)}/"
                    f"{len(train_sampler)}]\tloss {loss.item():.6f}",
                    flush=True,
                )
            state.commit()  # may raise HostsUpdatedInterrupt: hvd.elastic.run re-forms
        state.batch = 0
        test()


optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)


def on_state_reset():
    # The world changed: scale the learning rate to its new size.
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)

if args.record:
    # No collective after training: a worker's own test accuracy on the whole test set.
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_dataset.tensors[0]).argmax(1) == test_y).float().mean().item()
    fingerprint = hashlib.sha256()
    for tensor in model.state_dict().values():
        fingerprint.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    Path(args.record, f"rank-{hvd.rank()}.json").write_text(
        json.dumps(
            {
                "rank": hvd.rank(),
                "size": hvd.size(),
                "epoch": state.epoch,
                "accuracy": accuracy,
                "digest": fingerprint.hexdigest(),
            }
        )
    )
