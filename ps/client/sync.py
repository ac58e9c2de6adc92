"""One sync-mode step from the client's side: push this worker's gradients to every
shard, then long-poll each until the step is applied, dropped for a newer round, rolled
back, or out of time (the shard's rules: ``ps.shard.state``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from ps.errors import PSRoundChangedError, PSTimeoutError
from ps.protocol import FINAL, SUPERSEDED, UNKNOWN, StepArgs, StepReply

log = logging.getLogger("ps.client.sync")

# (shard index, "Push" or "WaitStep", payload) -> the shard's reply (retried by the caller)
StepCall = Callable[[int, str, object], StepReply]
# fn(index) for every shard in parallel -> {index: result}; raises the first error
EachShard = Callable[[Callable[[int], "StepReply | None"]], Mapping[int, "StepReply | None"]]


def sync_step(
    args: StepArgs,
    payloads: Mapping[int, object],
    call: StepCall,
    each: EachShard,
    round_moved: Callable[[int], bool],
    timeout: float,
) -> list[StepReply]:
    """Step ``args.step`` of round ``args.round`` on every shard; returns each shard's
    final reply (APPLIED or ROLLED_BACK).

    Raises:
        PSRoundChangedError: a newer round was published, or a shard dropped the step.
        PSTimeoutError: not every member pushed the step within ``timeout`` seconds.
        PSUnavailableError: a shard stayed unreachable (from ``call``)."""
    deadline = time.monotonic() + timeout
    stop = threading.Event()

    def one(i: int) -> StepReply | None:
        method, next_note = "Push", time.monotonic() + 10.0
        while not stop.is_set():
            if i == 0 and time.monotonic() > next_note:
                log.info(
                    "sync step %d of round %d (rank %d of %d): still waiting for the "
                    "other workers' gradients",
                    args.step,
                    args.round,
                    args.rank,
                    args.size,
                )
                next_note = time.monotonic() + 30.0
            if round_moved(args.round):
                stop.set()
                raise PSRoundChangedError(
                    f"a round after {args.round} was published; "
                    f"step {args.step} is dropped: re-form and redo it"
                )
            if time.monotonic() > deadline:
                stop.set()
                raise PSTimeoutError(
                    f"sync step {args.step} of round {args.round} was not "
                    f"completed by all {args.size} workers within {timeout:.0f}s"
                )
            reply = call(i, method, payloads[i] if method == "Push" else b"")
            if reply.status in FINAL:
                return reply
            method = "Push" if reply.status == UNKNOWN else "WaitStep"
        return None

    # None only from a call stopped by another one's error, which ``each`` raises
    replies = [r for r in each(one).values() if r is not None]
    superseded = [r for r in replies if r.status == SUPERSEDED]
    if superseded:
        newest = max(r.round or 0 for r in superseded)
        raise PSRoundChangedError(
            f"round {newest} replaced round {args.round}; step "
            f"{args.step} is dropped: re-form and redo it"
        )
    return replies
