"""This node's part of a joined job (``JoinedNode``): the job's secret in this process's
environment, the job's shape checked against what its leader wrote, and this host's
agent, started here as a child (a scheduler's signal to the process group reaches it:
SIGTERM drains the host, ``driver.agent``)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import uuid
from typing import Protocol

from driver.agent.loop import DRAIN_GRACE
from driver.errors import UsageError
from driver.join.ended import check_not_ended
from driver.join.settings import JoinSettings
from driver.join.shape import ShapedJob, check_shape
from driver.launch.assignments.handle import agent_command
from driver.launch.process import REAP_TIMEOUT, STOP_GRACE
from driver.quick_store import quick_store
from rendezvous import env
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.errors import RendezvousAuthError, RendezvousError
from rendezvous.job_secret import check_job_secret
from rendezvous.keys import JobKeys
from rendezvous.net.url import StoreURL
from rendezvous.retry import Backoff
from rendezvous.store import KVStore

log = logging.getLogger(__name__)

STORE_WAIT = 60.0
"""Seconds a node waits for the store another node serves (``embedded://HOST:PORT``)."""
STORE_LINGER = 5.0
"""Seconds at most that a node whose job ended keeps serving the job's store while other
nodes still watch it: they learn the end from it (a standby reads that nothing of the
job is left, then exits 0), which they cannot once it is gone."""


class JoinedJob(ShapedJob, Protocol):
    """What a joined node reads of the job's configuration besides its shape
    (``driver.config.JobConfig`` is one)."""

    @property
    def rendezvous(self) -> StoreURL: ...

    @property
    def driver_timeout(self) -> float: ...


class JoinedNode:
    """This node of job ``config.job_id`` (``config.join`` set)."""

    def __init__(self, config: JoinedJob, settings: JoinSettings):
        self._config = config
        self._settings = settings
        self._keys = JobKeys(config.job_id)
        self._agent: subprocess.Popen | None = None
        self._left = False  # SIGTERM came: the agent drains the host
        self._server: EmbeddedServer | None = None  # the store this node serves, if any

    def prepare(self) -> None:
        """The job's secret into this process's environment (the driver's, the agent's
        and the workers'), the store served when this node is the one named by
        ``embedded://HOST:PORT``, and the job's shape agreed on (another node's store is
        waited for up to ``STORE_WAIT``: the nodes start in any order).

        Raises:
            UsageError: this node disagrees with the job (its shape, its secret), or the
                store cannot be served or used.
        """
        os.environ[env.ENV_SECRET] = self._settings.secret
        port = self._settings.serves_port
        if port is not None:
            self._server = EmbeddedServer(self._settings.secret, bind=f"0.0.0.0:{port}")
            try:
                self._server.start()
            except RendezvousError as exc:
                raise UsageError(f"--rendezvous {self._config.rendezvous}: {exc}") from None
        patience = STORE_WAIT if self._config.rendezvous.scheme == "embedded" else 0.0
        backoff = Backoff(time.monotonic() + patience, initial=0.1, cap=1.0)
        store = quick_store(str(self._config.rendezvous), self._settings.secret)
        try:
            while True:
                try:
                    self.agree(store)
                    return
                except RendezvousError as exc:
                    if not backoff.pause():  # (the serving node may not be up yet)
                        self.close()
                        raise UsageError(f"--join: cannot use the store: {exc}") from None
        finally:
            store.close()

    def close(self) -> None:
        """After the job: the agent (``stop_agent``), then the store this node served,
        once the other nodes have left it (up to ``STORE_LINGER``) when the job ended
        rather than this node leaving it (drained: the others lose the store anyway)."""
        self.stop_agent()
        if self._server is not None:
            if not self._left:
                self._server.wait_unwatched(STORE_LINGER)
            self._server.stop()

    def agree(self, store: KVStore) -> None:
        """Check that the job has not ended (``driver.join.ended``: with ``--new-job``,
        forget that it did), and this node's shape against the job's while a leader
        leads it (the leader writes it when it claims the job: ``driver.job.session``).

        Raises:
            UsageError: this node's -np, --min-np, --max-np, command or secret differ
                from the job's (one line naming the difference; the job is untouched),
                or the job finished or failed and ``--new-job`` is not given.
            RendezvousError: the store cannot be used.
        """
        try:
            check_job_secret(store, self._keys, self._settings.secret)
        except RendezvousAuthError as exc:
            raise UsageError(f"--join: {exc}") from None
        check_not_ended(store, self._keys, self._settings.new_job)
        shape, leader = store.get(self._keys.shape), store.get(self._keys.driver)
        if shape is None or leader is None:
            return  # no job yet, or one between leaders: this node may lead it
        check_shape(self._config, shape.value)

    def start_agent(self) -> None:
        """Start this host's agent (it registers the node as joined, with its slots).

        Raises:
            OSError: it cannot be started.
        """
        command = [
            *agent_command(
                self._config.job_id,
                self._settings.host,
                uuid.uuid4().hex[:12],
                self._config.driver_timeout,
                detach=False,
            ),
            "--slots",
            str(self._settings.slots),
        ]
        environ = {**os.environ, env.ENV_RENDEZVOUS: str(self._config.rendezvous)}
        self._agent = subprocess.Popen(command, env=environ, stdin=subprocess.DEVNULL)

    def leave(self) -> None:
        """This node leaves the job (SIGTERM came): its agent drains the host (it says the
        host is preempted; the job has its workers leave at their next commit). A
        scheduler that signals the process group tells the agent too: the same drain."""
        self._left = True
        if self._agent is not None and self._agent.poll() is None:
            self._agent.send_signal(signal.SIGTERM)

    def stop_agent(self) -> None:
        """After the job: the agent exits by itself once the job ended (``ended``), or
        once it drained (up to ``DRAIN_GRACE``); SIGTERM after that, SIGKILL after a
        grace more."""
        agent = self._agent
        if agent is None:
            return
        first = DRAIN_GRACE if self._left else 0.0
        for act in (lambda: None, agent.terminate, agent.kill):
            act()
            try:
                agent.wait(timeout=first + STOP_GRACE + REAP_TIMEOUT)
                return
            except subprocess.TimeoutExpired:
                first = 0.0
        log.warning("the agent of %s did not exit", self._settings.host)
