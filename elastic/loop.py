"""``@elastic.run``: run a training function so that it survives failures and re-forms.

    sync(); fn(state)                       until it returns;
    on WorkerLostError:      restore the last commit, join the next round, sync, again;
    on HostsUpdatedInterrupt: join the next round, sync, again;
    after every re-form:     the state's reset callbacks.

The function is called anew after each re-form, so objects built inside it (a sampler,
an iterator) start from the synced state.
"""
from __future__ import annotations

import functools
import logging

from elastic import state as state_module
from elastic.errors import CommunicatorClosedError, HostsUpdatedInterrupt, WorkerLostError

log = logging.getLogger(__name__)


def run(func):
    """Decorate ``func(state, *args, **kwargs)``; see the module docstring.

    Raises whatever ``func`` raises other than the two re-form signals, and
    RendezvousError when no new round forms within the worker's round timeout."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        import elastic
        elastic.init()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                skip_sync = False
                with state_module.active(state):
                    return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
                log.info("re-forming: %s", exc)
            except WorkerLostError as exc:
                runtime = elastic._runtime_if_started()
                if runtime is None:
                    raise  # a static world (MPI, single process) cannot re-form
                superseded = isinstance(exc, CommunicatorClosedError)
                log.log(logging.INFO if superseded else logging.WARNING,
                        "round %d %s (%s); rolling back to the last commit", runtime.round_id,
                        "was superseded" if superseded else "lost a worker", exc)
                if not superseded:
                    runtime.report_failure(runtime.round_id, str(exc),
                                           runtime.suspect_of(exc, runtime.plan))
                state.restore()
            elastic._reform()
            state.on_reset()

    return wrapper
