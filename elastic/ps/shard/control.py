"""The control plane between shards: what a shard does when the coordinator (shard 0)
asks (``ShardControl``), and how it reaches the other shards (``Peers``)."""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from elastic.ps.shard.checkpoint import read_checkpoint, write_shard
from elastic.ps.errors import RETRYABLE, PSUnavailableError
from elastic.ps.settings import ServerSettings
from elastic.ps.shard.state import ShardState
from elastic.ps.client.link import ShardLink
from rendezvous.errors import RendezvousAuthError, RendezvousConnectionError

log = logging.getLogger("elastic.ps.shard.control")



def _lower_priority() -> None:
    """Make the calling thread yield the CPU to the training path (Linux: niceness is
    per thread). Best effort: where it cannot, files are written at normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (OSError, AttributeError):
        pass


class ShardControl:
    """Checkpoint and rollback operations on the local shard, by name (``handle``)."""

    OPS = ("Status", "Prepare", "Align", "Snapshot", "Abort", "Rollback")

    def __init__(self, state: ShardState, settings: ServerSettings):
        self.state = state
        self.settings = settings
        # Checkpoint files are hashed and written by one low-priority thread: on a busy
        # machine they then use idle CPU instead of stretching training steps.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ps-ckpt-writer",
                                          initializer=_lower_priority)

    def handle(self, op: str, args: dict) -> dict:
        return getattr(self, op.lower())(args)

    def status(self, args: dict) -> dict:
        return self.state.status()

    def prepare(self, args: dict) -> dict:
        return self.state.prepare(int(args["checkpoint_id"]), self.settings.pause_timeout)

    def align(self, args: dict) -> dict:
        step = self.state.align(int(args["checkpoint_id"]), int(args["target"]),
                                self.settings.align_timeout, self.settings.mode == "async")
        return {"step": step}

    def snapshot(self, args: dict) -> dict:
        """Copy (the gate reopens right after), then write this shard's file.
        Raises PSProtocolError (pause gone) or OSError (disk)."""
        checkpoint_id = int(args["checkpoint_id"])
        snap = self.state.snapshot(checkpoint_id)
        s = self.settings
        record = self._writer.submit(write_shard, s.checkpoint_dir, checkpoint_id, s.index,
                                     s.num_shards, snap).result(timeout=s.peer_call_timeout)
        return {"name": record.name, "size": record.size, "sha256": record.sha256, "step": snap.step}

    def abort(self, args: dict) -> dict:
        self.state.abort(int(args["checkpoint_id"]))
        return {}

    def rollback(self, args: dict) -> dict:
        """Become checkpoint ``checkpoint_id`` (None: the empty start) in ``generation``.
        Raises PSCheckpointError when the checkpoint no longer reads."""
        checkpoint_id = args.get("checkpoint_id")
        generation = args["generation"]
        if self.state.at_checkpoint(checkpoint_id):
            self.state.adopt_generation(generation)
        else:
            s = self.settings
            snap = None
            if checkpoint_id is not None:
                snap = read_checkpoint(s.checkpoint_dir, int(checkpoint_id)).shard_snapshot(
                    s.index, s.num_shards, s.split_threshold)
            self.state.load(snap, checkpoint_id, generation)
            log.info("shard %d: restored %s, step %d (generation %s)", s.index,
                     f"checkpoint {checkpoint_id}" if checkpoint_id else "the empty start",
                     self.state.step, generation)
        return self.state.status()

    def close(self) -> None:
        self._writer.shutdown(wait=False)


class Peers:
    """Control calls to the other shards, addresses from ``lookup(index)``."""

    def __init__(self, settings: ServerSettings, secret: str, lookup):
        self.settings = settings
        self._secret = secret
        self._lookup = lookup
        self._links: dict[int, ShardLink] = {}
        self._lock = threading.Lock()

    def _link(self, index: int, refresh: bool) -> ShardLink | None:
        with self._lock:
            link = self._links.get(index)
            if link is not None and not refresh:
                return link
        address = self._lookup(index)
        with self._lock:
            link = self._links.get(index)
            if address is None:
                return link
            if link is None or link.address != address:
                if link is not None:
                    link.close()
                link = self._links[index] = ShardLink(index, address, self._secret)
            return link

    def call(self, index: int, op: str, args: dict, retry_for: float) -> dict:
        """``op`` on shard ``index``, retrying unreachable/not-ready for ``retry_for``
        seconds (0: one attempt). Raises PSUnavailableError past that, or the shard's
        own typed error."""
        started = time.monotonic()
        deadline = started + retry_for
        delay, refresh, last, told = 0.02, False, None, False
        while True:
            try:
                link = self._link(index, refresh)
                if link is None:
                    raise RendezvousConnectionError(f"shard {index} has no published address")
                header, _ = link.request(op, args, timeout=self.settings.peer_call_timeout)
                return header
            except RETRYABLE + (RendezvousAuthError,) as exc:
                # An auth failure here means the published address is stale and now
                # belongs to another job's process: re-read it like a refused connection.
                last = exc
            if time.monotonic() + delay > deadline:
                raise PSUnavailableError(f"ps shard {index} did not answer {op} "
                                         f"within {retry_for:.0f}s: {last}")
            if not told and time.monotonic() - started > 5.0:
                log.info("waiting for ps shard %d to answer %s (up to %.0fs): %s",
                         index, op, retry_for, last)
                told = True
            time.sleep(delay)  # backoff between attempts at a peer that is down
            delay, refresh = min(delay * 2, 0.5), True

    def close(self) -> None:
        with self._lock:
            for link in self._links.values():
                link.close()
            self._links.clear()
