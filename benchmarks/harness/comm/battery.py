"""Every collective checked against numpy on random data (shared by the ring workers and
the MPI script). Each rank regenerates every rank's input from (seed, rank), so it can
compute the expected result locally with numpy alone."""

from __future__ import annotations

import hashlib

import numpy as np

from benchmarks.harness.comm.oracle import reduce_reference

DTYPES: tuple[type[np.generic], ...] = (np.float32, np.float64, np.int32, np.int64)
OPS = ("sum", "average", "max", "min")
# Odd shapes: scalars, empty, smaller than the world, not divisible by it, several
# dimensions, and one large enough to span several shared-memory pieces and TCP chunks.
SHAPES = ((), (0,), (1,), (3,), (7, 3), (2, 3, 5), (1001,), (0, 4), (300_007,))


def rank_input(seed: int, rank: int, shape, dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, len(shape), int(np.prod(shape)), np.dtype(dtype).num])
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _close(got: np.ndarray, want: np.ndarray, inputs, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.dtype.kind == "f":
        # The ring adds in a different order than numpy: allow rounding relative to the
        # magnitudes that were added.
        scale = sum(np.abs(x).astype(np.float64) for x in inputs) if inputs else 0
        tol = np.finfo(got.dtype).eps * 8 * (np.asarray(scale) + 1)
        assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= tol), what
    else:
        assert np.array_equal(got, want), what


def run_battery(comm, seed: int = 0, big: bool = True) -> int:
    """Run every check; returns how many passed, raises AssertionError on the first failure."""
    n, r = comm.size, comm.rank
    checks = 0
    shapes = SHAPES if big else SHAPES[:-1]
    digests = []
    for dtype in DTYPES:
        for shape in shapes:
            inputs = [rank_input(seed, j, shape, dtype) for j in range(n)]
            mine = inputs[r].copy()
            for op in OPS:
                got = comm.allreduce(mine, op=op)
                _close(
                    got,
                    reduce_reference(inputs, op),
                    inputs,
                    f"allreduce {op} {np.dtype(dtype)} {shape}",
                )
                assert np.array_equal(mine, inputs[r]), "allreduce modified its input"
                assert got is not mine and not np.shares_memory(got, mine)
                digests.append(_digest(got))
                checks += 1
    # Every rank must hold bit-identical results (replicas must not drift apart).
    all_digests = comm.allgather_object(digests)
    assert all(d == all_digests[0] for d in all_digests), "ranks got different bits"
    checks += 1

    # Non-contiguous and non-native-order inputs.
    base = np.arange(24, dtype=np.float64).reshape(4, 6) * (r + 1)
    got = comm.allreduce(base[:, ::2])
    want = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2] * sum(range(1, n + 1))
    assert np.allclose(got, want), "non-contiguous allreduce"
    got = comm.allreduce(np.arange(5, dtype=">i4") + r)
    assert np.array_equal(got, np.arange(5) * n + sum(range(n))), "big-endian allreduce"
    checks += 2

    # Broadcast from every root, many dtypes and shapes; non-roots pass junk or None.
    for root in range(n):
        for dtype in DTYPES + (np.uint8, np.bool_, np.complex64):
            for shape in ((), (0,), (5,), (3, 7), (200_003,) if big else (2003,)):
                want = rank_input(seed + 1, root, shape, np.float64).astype(dtype)
                x = want.copy() if r == root else (None if r % 2 else np.zeros(3))
                got = comm.broadcast(x, root=root)
                assert got.dtype == want.dtype and got.shape == want.shape, (
                    f"broadcast meta {dtype} {shape} from {root}"
                )
                assert np.array_equal(got, want), f"broadcast {dtype} {shape} from {root}"
                if r == root:
                    assert not np.shares_memory(got, x), "broadcast returned its input"
                checks += 1

    # Allgather with a different first dimension per rank (rank 1 contributes none).
    for dtype in DTYPES:
        for trailing in ((), (3,), (2, 2)):
            rows = [0 if j == 1 else j + 2 for j in range(n)]
            parts = [rank_input(seed + 2, j, (rows[j],) + trailing, dtype) for j in range(n)]
            got = comm.allgather(parts[r])
            want = np.concatenate(parts, axis=0)
            assert got.shape == want.shape and np.array_equal(got, want), (
                f"allgather {np.dtype(dtype)} {trailing}"
            )
            checks += 1
    got = comm.allgather(np.float32(r))  # 0-d arrays gather into shape (n,)
    assert np.array_equal(got, np.arange(n, dtype=np.float32)), "allgather 0-d"
    big_rows = 70_001 if big else 701
    parts = [rank_input(seed + 3, j, (big_rows + j, 3), np.float32) for j in range(n)]
    got = comm.allgather(parts[r])
    assert np.array_equal(got, np.concatenate(parts)), "large allgather"
    checks += 2

    # Object variants.
    obj = {"rank": r, "payload": list(range(r * 3)), "nested": {"x": (r, "s" * r)}}
    got = comm.allgather_object(obj)
    assert got == [
        {"rank": j, "payload": list(range(j * 3)), "nested": {"x": (j, "s" * j)}} for j in range(n)
    ], "allgather_object"
    for root in range(n):
        got = comm.broadcast_object(
            {"from": root, "blob": b"\x00" * 1000} if r == root else None, root=root
        )
        assert got == {"from": root, "blob": b"\x00" * 1000}, "broadcast_object"
    assert comm.allgather_object(None) == [None] * n
    checks += 2 + n

    # Bad arguments raise before any communication and leave the communicator usable.
    for bad in (
        lambda: comm.allreduce(np.ones(3), op="prod"),
        lambda: comm.allreduce(np.array(["a"])),
        lambda: comm.allreduce(np.array([object()])),
        lambda: comm.broadcast(np.ones(2), root=n),
        lambda: comm.allgather(np.array([object()])),
    ):
        try:
            bad()
        except (ValueError, TypeError):
            checks += 1
        else:
            raise AssertionError("a bad argument was accepted")
    for _ in range(3):
        comm.barrier()
    got = comm.allreduce(np.array([r], dtype=np.int64))
    assert got[0] == sum(range(n)), "communicator unusable after argument errors"
    return checks + 2
