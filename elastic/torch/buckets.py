"""Which gradients travel together: the bucket plan of ``DistributedOptimizer`` (pure).

Gradients are fused into buckets of about ``bucket_bytes`` so that one collective
carries many small tensors. Parameters are taken in reverse registration order, the
order backward usually produces their gradients (the last layer first), so a bucket
fills early and its allreduce overlaps the rest of backward. The first bucket is kept
small (``first_bucket_bytes``) so that communication starts as early as possible. A
bucket holds one dtype and one device.

Within a bucket, a gradient of at least ``alone_bytes`` travels as its own message:
the transport reads it where autograd left it, with no copy into a fused buffer (the
copy would cost about as much as the transfer on one host). Only the small ones are
packed together. The plan depends only on the parameters' sizes, dtypes and devices in
registration order, so it is the same on every rank, and so are the messages.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BUCKET_BYTES = 25 << 20
DEFAULT_FIRST_BUCKET_BYTES = 1 << 20
DEFAULT_ALONE_BYTES = 1 << 20


@dataclass(frozen=True)
class ParamSpec:
    numel: int
    element_size: int
    kind: str  # dtype and device, e.g. "torch.float32@cpu": one kind per bucket


@dataclass(frozen=True)
class Bucket:
    params: tuple[int, ...]  # indices in registration order, in reduction order
    alone: tuple[int, ...]  # members sent as messages of their own (large ones)
    fused: tuple[int, ...]  # members packed into one flat buffer, one message
    offsets: tuple[int, ...]  # where each fused member starts in the flat buffer
    numel: int  # elements of the flat buffer
    kind: str


def plan_buckets(
    specs: list[ParamSpec],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
    alone_bytes: int = DEFAULT_ALONE_BYTES,
) -> list[Bucket]:
    """Buckets over ``specs`` (registration order), in the order they are reduced.

    Raises ValueError when a size limit is below 1."""
    if bucket_bytes < 1 or first_bucket_bytes < 1:
        raise ValueError("bucket sizes must be at least 1 byte")
    done: list[list[int]] = []
    open_: dict[str, tuple[list[int], int]] = {}
    for index in reversed(range(len(specs))):
        spec = specs[index]
        members, size = open_.get(spec.kind, ([], 0))
        members.append(index)
        size += spec.numel * spec.element_size
        limit = min(first_bucket_bytes, bucket_bytes) if not done else bucket_bytes
        if size >= limit:
            done.append(members)
            open_.pop(spec.kind, None)
        else:
            open_[spec.kind] = (members, size)
    done.extend(members for members, _ in open_.values())
    buckets = []
    for members in done:
        alone = [i for i in members if specs[i].numel * specs[i].element_size >= alone_bytes]
        fused = [i for i in members if i not in alone]
        offsets, total = [], 0
        for index in fused:
            offsets.append(total)
            total += specs[index].numel
        buckets.append(
            Bucket(
                tuple(members),
                tuple(alone),
                tuple(fused),
                tuple(offsets),
                total,
                specs[members[0]].kind,
            )
        )
    return buckets
