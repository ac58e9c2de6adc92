"""``@elastic.run``: run a training function so that it survives failures and re-forms.

    sync(); [a snapshot the round asks]; fn(state)    until it returns;
    on WorkerLostError:      restore the last commit, join the next round, sync, again;
    on HostsUpdatedInterrupt: join the next round, sync, again (left out of a
                             handover, ``Plan.handover``: exit 0, the host leaves);
    waiting for a round:     another worker's finish (the job's result) ends the wait:
                             exit 0, nothing is left to do;
    after every re-form:     the state's reset callbacks;
    when fn returns:         record the finish in the store, unless a newer round that
                             includes this worker formed first: then restore the last
                             commit, join it, sync, again (its newcomers need the state).

The function is called anew after each re-form, so objects built inside it (a sampler,
an iterator) start from the synced state. With snapshots (``--checkpoint-dir``), the
sync may resume from one (``elastic.snapshots``), and a round the driver publishes to
take one (``Plan.snapshot``) has every member write its part before it trains on; when
the job is being stopped, the worker exits once its part is durable.

The loop's collaborators: the state it is given (sync, restore, reset callbacks; made
the current state for samplers while the function runs) and this process's runtime
(``elastic.context.current_runtime()``: the round to report and the next one to join;
a static world has none and cannot re-form).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

import elastic.context as context
from elastic.errors import (
    CommunicatorClosedError,
    HostsUpdatedInterrupt,
    TrainingFinishedError,
    WorkerHandedOverError,
    WorkerLostError,
)
from elastic.hangs.clock import CLOCK
from elastic.state import State, active
from rendezvous.schema.rounds import SNAPSHOT_FINAL

log = logging.getLogger(__name__)

R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)``; see the module docstring. Whatever
    ``func`` raises other than the two re-form signals passes through.

    Raises:
        WorkerLostError: the round broke in a static world (MPI, or alone), which
            cannot re-form.
        RendezvousError: no new round forms within the worker's round timeout.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        context.init()
        skip_sync = False
        while True:
            try:
                with active(state):  # (the state snapshots follow: its sync included)
                    if not skip_sync:
                        state.sync()
                    skip_sync = False
                    if _stop_asked(state):
                        raise SystemExit(0)
                    CLOCK.start_training()  # the hang watchdog watches it (elastic.hangs)
                    try:
                        result = func(state, *args, **kwargs)
                    finally:
                        CLOCK.stop_training()
                finished = context.current_runtime()
                if finished is None or finished.mark_finished():
                    return result  # training is complete: no new round for it
                # A round formed as the function returned: its newcomers wait for the
                # state. Join it from the last commit, as the others do, and run the
                # function again from there (what it did after that commit, once more).
                log.info("a new round formed as training ended; joining it")
                state.restore()
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
                log.info("re-forming: %s", exc)
            except WorkerLostError as exc:
                runtime = context.current_runtime()
                if runtime is None:
                    raise  # a static world (MPI, single process) cannot re-form
                superseded = isinstance(exc, CommunicatorClosedError)
                log.log(
                    logging.INFO if superseded else logging.WARNING,
                    "round %d %s (%s); rolling back to the last commit",
                    runtime.round_id,
                    "was superseded" if superseded else "lost a worker",
                    exc,
                )
                runtime.report_loss(runtime.plan, exc)
                state.restore()
            runtime = context.current_runtime()
            if runtime is not None:  # a static world has no next round to join
                try:
                    runtime.join()
                except (WorkerHandedOverError, TrainingFinishedError) as exc:
                    log.warning("%s", exc)
                    raise SystemExit(0) from None
            state.on_reset()

    return wrapper


def _stop_asked(state: State) -> bool:
    """Write the snapshot this round's plan asks for, if any (``Plan.snapshot``); True
    when the plan asks the workers to stop after it (said in one line that tells
    whether this worker's state is on disk)."""
    snapshots, runtime = context.snapshots(), context.current_runtime()
    if snapshots is not None:
        taken = snapshots.take_requested(state)
        if taken.stop and taken.error is None:
            log.warning("the job is stopping; this worker's state is written")
        elif taken.stop:
            log.warning("the job is stopping; this worker's state is NOT written: %s", taken.error)
        return taken.stop
    stop = (
        runtime is not None and runtime.plan is not None and runtime.plan.snapshot == SNAPSHOT_FINAL
    )
    if stop:
        log.warning("the job is stopping; this worker's state is not kept (no --checkpoint-dir)")
    return stop


__all__ = ["run"]
