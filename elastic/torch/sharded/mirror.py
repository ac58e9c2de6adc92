"""The mirror: each worker's committed part of a sharded state, kept in the host memory
of another worker, so that a lost worker's part can be rebuilt.

``MirrorServer`` (one per worker, for the life of the process) accepts the parts other
workers send and keeps the last ``KEEP`` commits of each, by (layout, rank).
``MirrorSender`` sends this worker's part of a commit on its own thread, off the
training path: the commit hands it the copy it just made and goes on; the next commit
first waits for that send to end (so a part's copies are reused only once sent).

The channel is ``multiprocessing.connection`` over TCP, authenticated with the job's
secret; a message is one pickle of (layout, rank, commit, parts). Sending is one-way
(no reply), so a sender killed after its send still has its bytes delivered by the
kernel.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

log = logging.getLogger(__name__)

#: how many commits of each part a mirror keeps (a sync may need the one before last)
KEEP = 2

Parts = dict[str, Any]


class MirrorServer:
    """Keeps other workers' parts (see the module docstring); ``address`` is where
    they send them."""

    def __init__(self, bind_host: str, secret: bytes):
        self._listener = Listener((bind_host, 0), authkey=secret)
        host, port = self._listener.address
        self.address = f"{host}:{port}"
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, int], list[tuple[int, Parts]]] = {}
        threading.Thread(target=self._accept, name="elastic-mirror", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:  # a failed handshake (not a member's connection)
                continue
            threading.Thread(
                target=self._receive, args=(conn,), name="elastic-mirror-in", daemon=True
            ).start()

    def _receive(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    layout, rank, commit, parts = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError, pickle.UnpicklingError):
                    return  # the sender is gone; what it sent in full is kept
                with self._lock:
                    kept = self._kept.setdefault((layout, rank), [])
                    kept[:] = [k for k in kept if k[0] != commit][-(KEEP - 1) :]
                    kept.append((commit, parts))

    def held(self) -> list[tuple[str, int, int]]:
        """(layout, rank, commit) of every part kept."""
        with self._lock:
            return [(lay, r, c) for (lay, r), kept in self._kept.items() for c, _ in kept]

    def part(self, layout: str, rank: int, commit: int) -> Parts:
        """The kept part. Raises KeyError when it is not kept."""
        with self._lock:
            for c, parts in self._kept.get((layout, rank), []):
                if c == commit:
                    return parts
        raise KeyError((layout, rank, commit))

    def keep_only(self, layout: str) -> None:
        """Forget the parts of every other layout (a sync cut a new one)."""
        with self._lock:
            self._kept = {k: v for k, v in self._kept.items() if k[0] == layout}


class MirrorSender:
    """Sends this worker's parts to its mirror, one at a time, on its own thread."""

    def __init__(self, secret: bytes):
        self._secret = secret
        self._conn: Connection | None = None
        self._to = ""
        self._done = threading.Event()
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the last send to end (True), at most ``timeout`` seconds."""
        return self._done.wait(timeout)

    def send(self, address: str, message: tuple[str, int, int, Parts]) -> None:
        """Send ``message`` to the mirror at ``address``, after the last send ended."""
        self._done.wait()
        self._done.clear()
        threading.Thread(
            target=self._send, args=(address, message), name="elastic-mirror-out", daemon=True
        ).start()

    def _send(self, address: str, message: tuple) -> None:
        try:
            if self._conn is None or self._to != address:
                self.close()
                host, port = address.rsplit(":", 1)
                self._conn, self._to = Client((host, int(port)), authkey=self._secret), address
            self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, EOFError) as exc:  # the mirror is gone: the next round re-forms
            log.info("mirror at %s did not take commit %d: %s", address, message[2], exc)
            self.close()
        finally:
            self._done.set()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
