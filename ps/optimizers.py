"""Optimizers applied on the shards (pure numpy, in place): SGD, momentum, Adam.

An optimizer's state ("slots") lives next to the parameter slice it updates, with the
same slicing on axis 0, so checkpoints and re-sharding treat slots exactly like
parameters. Scalar state (Adam's step count) is a 0-d slot: every slice of a variable
receives the same updates, so any slice's copy is the variable's.

``apply`` never writes into the parameter: it returns the updated values in another
array (``out`` when given: a spare buffer the caller knows nobody reads; slots are
updated in place). A shard can then hand out a parameter array to a pull or a
checkpoint without copying it or holding a lock while the bytes travel.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ps.errors import PSConfigError


class Optimizer:
    """Base: ``slots(param)`` makes the state; ``apply(param, grad, slots)`` returns the
    updated parameter (a new array) and updates the slots in place."""

    name = ""
    defaults: ClassVar[dict] = {}

    def __init__(self, lr: float, **args):
        unknown = set(args) - set(self.defaults)
        if unknown:
            raise PSConfigError(
                f"optimizer {self.name!r} has no argument(s) {sorted(unknown)}; "
                f"it takes lr and {sorted(self.defaults)}"
            )
        if not (isinstance(lr, (int, float)) and _finite(lr) and lr > 0):
            raise PSConfigError(f"lr must be a positive number, not {lr!r:.40}")
        self.lr = float(lr)
        self.args = {**self.defaults, **{k: self._convert(k, v) for k, v in args.items()}}

    def _convert(self, name: str, value):
        """``value`` as the type of argument ``name``'s default. Raises PSConfigError
        for a value that does not convert, or converts to an infinite number."""
        kind = type(self.defaults[name])
        try:
            converted = kind(value)
        except (TypeError, ValueError, OverflowError):
            converted = None
        if converted is None or (isinstance(converted, float) and not math.isfinite(converted)):
            raise PSConfigError(
                f"optimizer {self.name!r} argument {name!r} must be a finite "
                f"{kind.__name__}, not {str(value)[:40]!r}"
            )
        return converted

    def config(self) -> dict:
        """JSON-able description; ``make_optimizer(**config)`` rebuilds it."""
        return {"optimizer": self.name, "lr": self.lr, **self.args}

    def slots(self, param: np.ndarray) -> dict[str, np.ndarray]:
        return {}

    def apply(
        self,
        param: np.ndarray,
        grad: np.ndarray,
        slots: dict[str, np.ndarray],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        raise NotImplementedError


def _finite(number: float) -> bool:
    """A finite number that fits a float (an int too large for one is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _minus(
    param: np.ndarray, scale: float, direction: np.ndarray, out: np.ndarray | None
) -> np.ndarray:
    """``param - scale * direction`` in param's dtype, into ``out`` (or a new array)."""
    if out is None or out.shape != param.shape or out.dtype != param.dtype:
        out = np.empty_like(param)
    np.multiply(direction, -scale, out=out, casting="same_kind")
    out += param
    return out


class SGD(Optimizer):
    name = "sgd"

    def apply(self, param, grad, slots, out=None):
        return _minus(param, self.lr, grad, out)


class Momentum(Optimizer):
    """v = momentum * v + g; p -= lr * v (or lr * (g + momentum * v) with nesterov)."""

    name = "momentum"
    defaults: ClassVar[dict] = {"momentum": 0.9, "nesterov": False}

    def slots(self, param):
        return {"velocity": np.zeros_like(param)}

    def apply(self, param, grad, slots, out=None):
        v = slots["velocity"]
        v *= self.args["momentum"]
        v += grad
        if self.args["nesterov"]:
            return _minus(param, self.lr, grad + self.args["momentum"] * v, out)
        return _minus(param, self.lr, v, out)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``t`` counts the updates applied."""

    name = "adam"
    defaults: ClassVar[dict] = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}

    def slots(self, param):
        return {
            "m": np.zeros_like(param),
            "v": np.zeros_like(param),
            "t": np.zeros((), dtype=np.int64),
        }

    def apply(self, param, grad, slots, out=None):
        b1, b2, eps = self.args["beta1"], self.args["beta2"], self.args["eps"]
        slots["t"][...] += 1
        t = int(slots["t"])
        m, v = slots["m"], slots["v"]
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * np.square(grad)
        step = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        return _minus(param, step, m / (np.sqrt(v) + eps), out)


OPTIMIZERS = {cls.name: cls for cls in (SGD, Momentum, Adam)}


def make_optimizer(optimizer: str = "sgd", lr: float = 0.01, **args) -> Optimizer:
    """Raises PSConfigError for an unknown name, a bad lr or an unknown argument."""
    cls = OPTIMIZERS.get(str(optimizer).lower())
    if cls is None:
        raise PSConfigError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZERS)}")
    return cls(lr, **args)
