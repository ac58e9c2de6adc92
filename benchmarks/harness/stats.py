"""The figures a benchmark line reports from its samples."""

from __future__ import annotations

import os
import statistics


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summary(samples: list[float]) -> dict:
    if not samples:
        return {"median_s": None, "p90_s": None, "max_s": None, "samples": []}
    return {
        "median_s": round(statistics.median(samples), 4),
        "p90_s": round(quantile(samples, 0.9), 4),
        "max_s": round(max(samples), 4),
        "samples": [round(s, 4) for s in samples],
    }


def median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)
