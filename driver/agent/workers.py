"""The agent's end of the host channel (``rendezvous.host_channel``): its workers
register and learn their rounds through it, so the store holds one lease and one watch
per host, not per worker.

``WorkerChannel`` listens on a Unix socket in a directory of its own (mode 0700: only
the agent's user reaches it; no network hop). One thread per connected worker reads its
``Register``, has the registration written (``register``: under the agent's lease; the
same key and record a worker writes itself, so the driver sees no difference), answers
``Registered``, and then waits for the connection to close: the worker's process ended
(or the worker broke the channel), and its registration is deleted at once
(``unregister``). ``forget`` does the same when the agent sees its child exit first (a
child of the worker holding the socket open must not keep a dead worker registered).

``publish`` forwards each newer round, as the agent read its host's part, to every
connected worker; a worker that connects is sent the newest round first, before its
registration is written, so it misses no round that could include it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
from typing import Callable

from driver.threads import spawn
from rendezvous.errors import RendezvousError
from rendezvous.host_channel import (
    ChannelClosedError,
    Message,
    MessageReader,
    Refused,
    Register,
    Registered,
    RoundNews,
    send,
)
from rendezvous.host_plan import RoundView
from rendezvous.keys import JobKeys
from rendezvous.store import KVStore, Lease

log = logging.getLogger(__name__)

SOCKET_NAME = "workers.sock"
MAX_SOCKET_PATH = 100  # bytes of a Unix socket's path (Linux takes at most 107)


def store_registrations(
    store: KVStore, keys: JobKeys, lease: Callable[[], Lease | None]
) -> tuple[Callable[[str, bytes], int], Callable[[str], None]]:
    """The ``register`` and ``unregister`` of a ``WorkerChannel`` that writes to
    ``store`` (``keys``: the job's) under the agent's lease (``lease()``: None while the
    agent holds none)."""

    def register(worker_id: str, record: bytes) -> int:
        held = lease()
        if held is None:
            raise RendezvousError("the agent is not registered: it holds no lease")
        store.put(keys.worker(worker_id), record, held.id)
        return held.id

    def unregister(worker_id: str) -> None:
        try:
            store.delete(keys.worker(worker_id))
        except RendezvousError as exc:  # it ends with the agent's lease anyway
            log.debug("cannot unregister worker %s: %s", worker_id, exc)

    return register, unregister


class _Worker:
    """One connected worker: its socket, a lock so that a round forwarded and an answer
    never interleave on it, and the newest round not yet sent, which a thread of its own
    sends (a frozen worker that reads nothing blocks that thread only, never the
    agent's; a round newer than one still waiting replaces it)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.worker_id: str | None = None
        self.record = b""  # its registration (``WorkerInfo``), as it sent it
        self._wake = threading.Condition()
        self._pending: RoundNews | None = None
        self._closed = False

    def offer(self, news: RoundNews) -> None:
        """Send round ``news`` soon (from the sending thread)."""
        with self._wake:
            self._pending = news
            self._wake.notify()

    def send_rounds(self) -> None:
        """The sending thread: each newest round, until the worker is closed or gone."""
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                news, self._pending = self._pending, None
            if self._closed or news is None or not self.send(news):
                return

    def send(self, message: Message) -> bool:
        """False when the worker is gone (its reader thread then cleans up)."""
        with self.lock:
            try:
                send(self.sock, message)
                return True
            except ChannelClosedError:
                return False

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class WorkerChannel:
    """The host channel of one agent. ``register(worker_id, record)`` writes a worker's
    registration under the agent's lease and returns that lease's id (raises
    ``RendezvousError`` when it cannot); ``unregister(worker_id)`` deletes it (best
    effort, never raises)."""

    def __init__(
        self,
        register: Callable[[str, bytes], int],
        unregister: Callable[[str], None],
    ):
        self._register = register
        self._unregister = unregister
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}  # registered, by worker id
        self._connected: set[_Worker] = set()
        self._latest: RoundNews | None = None
        self._latest_round = 0
        self._dir: str | None = None
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    def start(self) -> str:
        """Listen; returns the socket's path (what the workers are told).

        Raises:
            OSError: the socket cannot be made."""
        self._dir = tempfile.mkdtemp(prefix="elastic-agent-")  # (mode 0700)
        path = os.path.join(self._dir, SOCKET_NAME)
        if len(path.encode()) > MAX_SOCKET_PATH:  # a long TMPDIR: sockets take 107 bytes
            os.rmdir(self._dir)
            self._dir = tempfile.mkdtemp(prefix="elastic-agent-", dir="/tmp")
            path = os.path.join(self._dir, SOCKET_NAME)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(128)
        except OSError:
            listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._listener = listener
        spawn("agent-channel", self._accept, listener)
        return path

    @property
    def registered(self) -> frozenset[str]:
        """The workers registered through the channel now."""
        with self._lock:
            return frozenset(self._workers)

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed
            worker = _Worker(sock)
            with self._lock:
                self._connected.add(worker)
            spawn("agent-channel-worker", self._serve, worker)
            spawn("agent-channel-rounds", worker.send_rounds)

    def _serve(self, worker: _Worker) -> None:
        reader = MessageReader(worker.sock)
        try:
            while True:
                message = reader.next()
                if isinstance(message, Register):
                    self._take_registration(worker, message)
        except (ChannelClosedError, ValueError) as exc:
            log.debug("host channel of %s ends: %s", worker.worker_id, exc)
        finally:
            self._drop(worker)

    def _take_registration(self, worker: _Worker, message: Register) -> None:
        worker_id = message.info.worker_id
        with self._lock:
            # First the newest round, then the registration: a round that includes the
            # worker comes after its registration, so it is forwarded, never missed.
            worker.worker_id = worker_id
            worker.record = message.info.to_json()
            replaced = self._workers.get(worker_id)
            self._workers[worker_id] = worker
            latest = self._latest
            if latest is not None:
                worker.offer(latest)
        if replaced is not None and replaced is not worker:
            replaced.close()
        try:
            lease_id = self._register(worker_id, worker.record)
        except RendezvousError as exc:
            log.warning("cannot register worker %s: %s", worker_id, exc)
            worker.send(Refused(str(exc)))
            return
        worker.send(Registered(lease_id))

    def register_again(self) -> None:
        """Write every connected worker's registration again (under the agent's new
        lease, after the store let the old one lapse) and tell each worker the new
        lease (what its reports are written under)."""
        with self._lock:
            workers = list(self._workers.items())
        for worker_id, worker in workers:
            try:
                lease_id = self._register(worker_id, worker.record)
            except RendezvousError as exc:
                log.warning("cannot register worker %s again: %s", worker_id, exc)
                continue
            worker.send(Registered(lease_id))

    def _drop(self, worker: _Worker) -> None:
        """The worker's connection ended: so does its registration."""
        with self._lock:
            self._connected.discard(worker)
            worker_id = worker.worker_id
            mine = worker_id is not None and self._workers.get(worker_id) is worker
            if mine:
                del self._workers[worker_id]  # type: ignore[arg-type]
        worker.close()
        if mine and not self._closed.is_set():
            self._unregister(worker_id)  # type: ignore[arg-type]

    def forget(self, worker_id: str) -> None:
        """Worker ``worker_id``'s process ended: delete its registration now (if it
        registered through the channel) and close its connection."""
        with self._lock:
            worker = self._workers.pop(worker_id, None)
        if worker is None:
            return
        worker.close()
        self._unregister(worker_id)

    def publish(self, view: RoundView) -> None:
        """Forward round ``view`` (this host's reading of it) to every connected worker,
        unless a newer round was forwarded already."""
        news = RoundNews.of(view)
        with self._lock:
            if view.round_id <= self._latest_round:
                return
            self._latest, self._latest_round = news, view.round_id
            targets = list(self._connected)
        for worker in targets:
            worker.offer(news)

    def close(self) -> None:
        """Stop listening and close every connection (the registrations stay: they end
        with the agent's lease)."""
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            workers = list(self._connected)
        for worker in workers:
            worker.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
