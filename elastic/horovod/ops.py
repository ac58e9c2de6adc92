"""Horovod's reduction operations (``hvd.Average``, ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``,
``hvd.Adasum``, ``hvd.Product``) and what each is on our runtime (pure).

Horovod's are opaque constants compared by identity; ours are the members of
``ReduceOp``, whose values are the names our collectives take ("average", "sum", "min",
"max"). Adasum (a different algorithm, not an elementwise reduction) and Product (no
ring reduction of ours multiplies) have no equivalent: naming one is a
``HorovodUnsupportedError`` in one line, at the call that names it.
"""

from __future__ import annotations

import enum

from elastic.horovod.errors import HorovodUnsupportedError


class ReduceOp(enum.Enum):
    """A Horovod reduction; ``value`` names it as our collectives do (Adasum and Product
    have no collective of ours: ``op_name`` refuses them)."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    ADASUM = "adasum"
    PRODUCT = "product"

    def __repr__(self) -> str:
        return f"hvd.{self.name.capitalize()}"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Adasum = ReduceOp.ADASUM
Product = ReduceOp.PRODUCT

_UNSUPPORTED = {
    ReduceOp.ADASUM: "hvd.Adasum is not supported by elastic.horovod: use op=hvd.Average "
    "(learning rate scaled by hvd.size()) or op=hvd.Sum",
    ReduceOp.PRODUCT: "hvd.Product is not supported by elastic.horovod: reduce logarithms "
    "with hvd.Sum, or use hvd.Min/hvd.Max",
}


def op_name(op: ReduceOp | None = None, average: bool | None = None) -> str:
    """Our collectives' name for Horovod's ``op`` (None: Average), or for the older
    ``average=True/False`` argument Horovod still takes in its place.

    Raises:
        ValueError: both ``op`` and ``average`` are given (Horovod refuses that too).
        TypeError: ``op`` is not one of Horovod's reduction operations.
        HorovodUnsupportedError: ``op`` is ``hvd.Adasum`` or ``hvd.Product``.
    """
    if op is not None and average is not None:
        raise ValueError("give op= or the older average=, not both (op supersedes average)")
    if op is None:
        op = Sum if average is False else Average
    if not isinstance(op, ReduceOp):
        raise TypeError(
            f"op must be hvd.Average, hvd.Sum, hvd.Min or hvd.Max, not {op!r} ({type(op).__name__})"
        )
    if op in _UNSUPPORTED:
        raise HorovodUnsupportedError(_UNSUPPORTED[op])
    return op.value


__all__ = ["ReduceOp", "Average", "Sum", "Min", "Max", "Adasum", "Product", "op_name"]
