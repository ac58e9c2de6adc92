"""The control plane between shards: what a shard does when the coordinator (shard 0)
asks (``ShardControl``), and how it reaches the other shards (``Peers``)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from elastic.thread_priority import lower_this_thread
from ps.client.link import ShardLink, where
from ps.errors import RETRYABLE, PSProtocolError, PSUnavailableError
from ps.protocol import (
    A,
    Aligned,
    Call,
    CheckpointArgs,
    Empty,
    R,
    RollbackArgs,
    ShardStatus,
    Snapshotted,
)
from ps.settings import ServerSettings
from ps.shard.checkpoint import read_checkpoint, write_shard
from ps.shard.state import ShardState
from rendezvous.errors import RendezvousAuthError, RendezvousConnectionError
from rendezvous.retry import Backoff
from rendezvous.schema.ps import ShardInfo

log = logging.getLogger("ps.shard.control")


class ShardControl:
    """Checkpoint and rollback operations on the local shard, by name (``handle``)."""

    def __init__(self, state: ShardState, settings: ServerSettings):
        self.state = state
        self.settings = settings
        # Checkpoint files are hashed and written by one low-priority thread: on a busy
        # machine they then use idle CPU instead of stretching training steps.
        self._writer = ThreadPoolExecutor(
            1,
            thread_name_prefix="ps-ckpt-writer",
            initializer=functools.partial(lower_this_thread, 10),
        )

    def handle(self, call: Call[A, R], args: A) -> R:
        """Run ``call`` (one of ``protocol.CONTROL_CALLS``) on this shard."""
        return getattr(self, call.name.lower())(args)

    def status(self, args: Empty) -> ShardStatus:
        return self.state.status()

    def prepare(self, args: CheckpointArgs) -> ShardStatus:
        return self.state.prepare(args.checkpoint_id, self.settings.pause_timeout, args.seal)

    def align(self, args: CheckpointArgs) -> Aligned:
        """Raises PSProtocolError without a target or when the checkpoint's pause is gone."""
        if args.target is None:
            raise PSProtocolError(f"Align of checkpoint {args.checkpoint_id} names no target step")
        return Aligned(
            self.state.align(
                args.checkpoint_id,
                args.target,
                self.settings.align_timeout,
                self.settings.mode == "async",
            )
        )

    def snapshot(self, args: CheckpointArgs) -> Snapshotted:
        """Copy (the gate reopens right after), then write this shard's file.

        Raises:
            PSProtocolError: the checkpoint's pause is gone.
            PSCheckpointWriteError: the disk refused the file (``PSNoSpaceError``: it
                is full)."""
        snap = self.state.snapshot(args.checkpoint_id, self.settings.pause_timeout)
        s = self.settings
        record = self._writer.submit(
            write_shard, s.checkpoint_root(), args.checkpoint_id, s.index, s.num_shards, snap
        ).result(timeout=s.peer_call_timeout)
        return Snapshotted(record.name, record.size, record.sha256, snap.step)

    def abort(self, args: CheckpointArgs) -> Empty:
        self.state.abort(args.checkpoint_id)
        return Empty()

    def rollback(self, args: RollbackArgs) -> ShardStatus:
        """Become checkpoint ``args.checkpoint_id`` (None: the empty start) in
        ``args.generation``. Raises PSCheckpointError when the checkpoint no longer reads."""
        checkpoint_id, generation = args.checkpoint_id, args.generation
        if self.state.at_checkpoint(checkpoint_id):
            self.state.adopt_generation(generation)
        else:
            s = self.settings
            snap = None
            if checkpoint_id is not None:
                snap = read_checkpoint(s.checkpoint_root(), checkpoint_id).shard_snapshot(
                    s.index, s.num_shards, s.split_threshold
                )
            self.state.load(snap, checkpoint_id, generation)
            log.info(
                "shard %d: restored %s, step %d (generation %s)",
                s.index,
                f"checkpoint {checkpoint_id}" if checkpoint_id else "the empty start",
                self.state.step,
                generation,
            )
        return self.state.status()

    def close(self) -> None:
        self._writer.shutdown(wait=False)


class Peers:
    """Control calls to the other shards, their records (address and incarnation) from
    ``lookup(index)``."""

    def __init__(
        self, settings: ServerSettings, secret: str, lookup: Callable[[int], ShardInfo | None]
    ):
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
        info = self._lookup(index)
        with self._lock:
            link = self._links.get(index)
            if info is None:
                return link
            address, incarnation = where(info)
            if link is None or (link.address, link.incarnation) != (address, incarnation):
                if link is not None:
                    link.close()
                link = self._links[index] = ShardLink(
                    index, address, self._secret, incarnation=incarnation
                )
            return link

    def call(
        self,
        index: int,
        call: Call[A, R],
        args: A,
        retry_for: float,
        timeout: float | None = None,
    ) -> R:
        """``call`` on shard ``index``; its reply record.

        Retries an unreachable or not-ready shard for ``retry_for`` seconds (0: one
        attempt, and one more at once if the address was cached), re-reading its
        address. ``timeout`` bounds one attempt (default: ``peer_call_timeout``).

        Raises:
            PSUnavailableError: the shard did not answer within ``retry_for``.
            PSError: the shard's own typed error."""
        started = time.monotonic()
        backoff = Backoff(started + retry_for, initial=0.02, cap=0.5)
        refresh, told = False, False
        while True:
            try:
                link = self._link(index, refresh)
                if link is None:
                    raise RendezvousConnectionError(f"shard {index} has no published address")
                header, _ = link.request(
                    call.name, args, timeout=timeout or self.settings.peer_call_timeout
                )
                return call.reply.from_dict(header)
            except RETRYABLE + (RendezvousAuthError,) as exc:
                # An auth failure here means the published address is stale and now
                # belongs to another job's process: re-read it like a refused connection
                # (as ``StaleIncarnationError``, a retryable one: the shard restarted).
                last = exc
            if not refresh:
                # The address came from the cache and the shard may have restarted
                # elsewhere since: read it again and try at once, whatever ``retry_for``.
                refresh = True
                continue
            if not told and time.monotonic() - started > 5.0:
                log.info(
                    "waiting for ps shard %d to answer %s (up to %.0fs): %s",
                    index,
                    call.name,
                    retry_for,
                    last,
                )
                told = True
            if not backoff.pause():
                raise PSUnavailableError(
                    f"ps shard {index} did not answer {call.name} within {retry_for:.0f}s: {last}"
                )
            refresh = True

    def close(self) -> None:
        with self._lock:
            for link in self._links.values():
                link.close()
            self._links.clear()
