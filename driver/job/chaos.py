"""``--chaos-kill-interval``: SIGKILL a random worker of the current round at random times.

The schedule is a pure function; the timer thread only calls ``on_tick`` (the job posts
itself a ``ChaosTick``), and the job's main loop picks the victim (it owns the worker
table) through ``strike`` and reports each kill as a ``chaos_kill`` event. A chaos
victim's death does not count against its host's blacklist record: the host did
nothing wrong.
"""

from __future__ import annotations

import functools
import random
import threading
from typing import Callable

from driver.config import JobConfig
from driver.job.messages import ChaosTick, Message


def next_kill_delay(rng: random.Random, interval: float) -> float:
    """Seconds to the next kill: uniform in [0.5, 1.5] x ``interval`` (pure given ``rng``)."""
    return interval * rng.uniform(0.5, 1.5)


def pick_victim(rng: random.Random, candidates: list[str]) -> str | None:
    """A worker id from ``candidates`` (sorted first, so a seeded run repeats), or None."""
    return rng.choice(sorted(candidates)) if candidates else None


class ChaosMonkey:
    """Calls ``on_tick`` about every ``interval`` seconds until ``max_kills`` kills were
    made (None: no limit) or ``stop``; ``seed`` makes the schedule and victims repeat."""

    def __init__(
        self,
        interval: float,
        max_kills: int | None,
        on_tick: Callable[[], None],
        seed: int | None = None,
    ):
        self.interval = interval
        self.max_kills = max_kills
        self.on_tick = on_tick
        self.rng = random.Random(seed)
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _exhausted(self) -> bool:
        return self.max_kills is not None and self.kills >= self.max_kills

    def _run(self) -> None:
        while not self._stop.wait(next_kill_delay(self.rng, self.interval)):
            if self._exhausted():
                return
            self.on_tick()

    def strike(self, candidates: list[str]) -> str | None:
        """Called by the main loop: choose the victim among ``candidates`` and count it."""
        if self._exhausted():
            return None
        victim = pick_victim(self.rng, candidates)
        if victim is not None:
            self.kills += 1
        return victim


def chaos_monkey(config: JobConfig, post: Callable[[Message], None]) -> ChaosMonkey | None:
    """``--chaos-kill-interval``'s timer (None when unset), not started yet: each tick
    posts ``ChaosTick`` to the loop (``post``)."""
    if not config.chaos_kill_interval:
        return None
    tick = functools.partial(post, ChaosTick())
    return ChaosMonkey(config.chaos_kill_interval, config.chaos_max_kills, tick)
