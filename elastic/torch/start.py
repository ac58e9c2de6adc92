"""``elastic.torch.init(backend=None)``: join the job the way a GPU worker should.

CUDA starts first (seconds on a fresh process), then the worker registers: a newcomer
enters a round only once its CUDA is up, so the first collective of the round it joins
(the sync, where the round's NCCL group forms) does not wait on its CUDA start.
"""

from __future__ import annotations

import torch

import elastic


def init(backend: str | None = None) -> None:
    """``elastic.init(torch_backend=backend)``, CUDA started before when there is a GPU.
    ``backend``: "auto" (NCCL for CUDA tensors, the ring for the others), "ring",
    "gloo" or "nccl"; None leaves it to ``ELASTIC_TORCH_BACKEND``.

    Raises like ``elastic.init`` (ValueError for a backend that is no backend)."""
    if torch.cuda.is_available():
        torch.cuda.init()
    elastic.init(torch_backend=backend)
