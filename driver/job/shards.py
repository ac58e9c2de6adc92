"""The job's ps shards (``--num-ps``), started, adopted and stopped for the loop.

``JobShards.start`` starts them (``driver.ps.supervisor``) and waits until they serve,
in a helper thread, so that SIGINT or SIGTERM (``interrupt``) ends the wait at once;
``adopt`` supervises those a predecessor started; ``stop`` stops them at the job's end.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Callable

from driver import events as ev
from driver.config import JobConfig
from driver.errors import JobFailed, JobStopped
from driver.hosts.shard_placement import ShardPlacement
from driver.job import messages as msg
from driver.job.session import StoreSession
from driver.job.wiring import shard_command_for, shard_commands
from driver.launch.base import Launcher
from driver.launch.process import STOP_GRACE, WorkerProcess
from driver.ps.supervisor import PSSupervisor, ShardLaunch, SupervisionSettings
from driver.threads import spawn


class JobShards:
    """The ps shards of the job of ``config``, launched by ``launcher``, meeting in the
    store of ``session``; ``post`` tells the loop a shard cannot go on; ``usable_hosts``:
    the hosts a shard may be started on now (``--ps-placement spread``)."""

    def __init__(
        self,
        config: JobConfig,
        session: StoreSession,
        *,
        launcher: Launcher,
        events: ev.EventSink,
        clock: Callable[[], float],
        post: Callable[[msg.Message], None],
        usable_hosts: Callable[[], Sequence[str]] = tuple,
    ):
        self._config = config
        self._session = session
        self._launcher = launcher
        self._events = events
        self._clock = clock
        self._post = post
        self._usable_hosts = usable_hosts
        self._signalled: list[int] = []  # SIGINT/SIGTERM received (``interrupt``)
        self._wake = threading.Event()  # a signal, or the ps shards' start is over
        self._ps: PSSupervisor | None = None

    def interrupt(self, signum: int) -> None:
        """SIGINT or SIGTERM came (thread-safe): a wait for the ps shards ends at once."""
        self._signalled.append(signum)
        self._wake.set()

    def start(self) -> None:
        """Start ``--num-ps`` ps shards (if any) and wait until they serve (up to
        ``--start-timeout``) in a helper thread, so that SIGINT or SIGTERM
        (``interrupt``) ends the wait at once: the loop that handles signals does not
        run yet.

        Raises:
            JobFailed: the shards did not come up.
            JobStopped: SIGINT or SIGTERM came first.
            LauncherError: a shard cannot be started.
        """
        cfg = self._config
        if not cfg.num_ps:
            return
        self._ps = supervisor = self._supervisor()
        ended: list[BaseException | None] = []

        def start() -> None:
            try:
                supervisor.start()
                ended.append(None)
            except BaseException as exc:  # noqa: BLE001  (handed to the waiting thread)
                ended.append(exc)
            finally:
                self._wake.set()

        spawn("ps-start", start)
        # The supervisor has its own deadline; this one only guards against a bug there.
        self._wake.wait(cfg.start_timeout + 2 * STOP_GRACE)
        if self._signalled:
            raise JobStopped(
                f"stopped by {signal.Signals(self._signalled[0]).name} while the ps shards "
                "started; all workers were stopped",
                self._signalled[0],
            )
        if not ended:
            raise JobFailed(f"ps shards not ready within {cfg.start_timeout:g}s")
        if ended[0] is not None:
            raise ended[0]

    def adopt(self, handed_over: Mapping[str, WorkerProcess]) -> None:
        """Supervise the ps shards a driver that led the job before started (those among
        ``handed_over``, the processes its agents' records gave, labelled ``psI``, their
        backups ``psI-backup``), and start the missing ones.

        Raises:
            LauncherError: a missing shard cannot be started.
        """
        if not self._config.num_ps:
            return
        running: dict[int, WorkerProcess] = {}
        backups: dict[int, WorkerProcess] = {}
        for p in handed_over.values():
            label = p.spec.label
            index = label[2:].removesuffix("-backup")
            if label.startswith("ps") and index.isdigit():
                (backups if label.endswith("-backup") else running)[int(index)] = p
        self._ps = self._supervisor()
        self._ps.adopt(running, backups)

    def _supervisor(self) -> PSSupervisor:
        """The ps supervisor of this job (``--ps-placement`` spread: on the usable hosts)."""
        cfg, session = self._config, self._session
        bind = "127.0.0.1" if session.all_local else session.advertised_host
        placement = None
        if cfg.ps_placement == "spread":

            def command(index: int, host: str) -> tuple[str, ...]:
                return shard_command_for(cfg, index, session.bind_host(host) or host)

            placement = ShardPlacement(command, self._usable_hosts)
        launch = ShardLaunch(
            self._launcher, tuple(shard_commands(cfg, bind)), session.wiring.env(), placement
        )
        settings = SupervisionSettings(
            ready_timeout=cfg.start_timeout,
            store_patience=cfg.elastic_timeout,
            replicas=cfg.ps_replicas,
            checkpoints=bool(cfg.ps_checkpoint_dir),
        )
        return PSSupervisor(
            launch,
            settings,
            store=session.require_store(),
            keys=session.keys,
            events=self._events,
            on_fatal=lambda reason: self._post(msg.Fatal(reason)),
            clock=self._clock,
        )

    def stop(self, leads: bool) -> str | None:
        """Stop the ps shards, when there are and this driver leads the job (``leads``;
        again: the first call's answer): why their last state is in no checkpoint
        (``PSSupervisor.stop``), None when it is or there is nothing to say."""
        if self._ps is None or not leads:
            return None
        return self._ps.stop()
