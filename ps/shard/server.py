"""A parameter-server shard process (its command line: ``ps.server``).

A shard announces itself and its checkpoints through the rendezvous store only
(``rendezvous.schema.ps``'s records):

* as soon as it serves (control calls at once; data calls answer "not ready" until the
  state is restored), ``ShardInfo(ready=False)`` under ``JobKeys.ps_shard(I)``, so
  clients and peers find it while it restores;
* once restored (async: the newest complete checkpoint; sync: shard 0 brings every
  shard to the newest complete checkpoint, see coordinator.py), the same record with
  ``ready=True`` and the same pid: the driver's supervisor waits for that;
* shard 0 checkpoints every ``--checkpoint-interval`` seconds and, after each complete
  coordinated checkpoint, writes a ``CheckpointRecord`` (id, step, dir, how long
  training was paused and how long the files took) under ``JobKeys.ps_checkpoint``;
  checkpoints that fail, a ``CheckpointFailedRecord`` under
  ``JobKeys.ps_checkpoint_failed`` (when ``shard.failures`` says: not every attempt);
* on SIGTERM/SIGINT a shard puts the shards' state in a checkpoint that seals them
  before it exits (``ShardServer.finish``, within ``--stop-timeout``): shard 0 makes
  it and announces it with ``final`` set, or says with ``final`` set that it could not
  write it; another shard asks shard 0 for it.

Without ``ELASTIC_RENDEZVOUS``/``ELASTIC_JOB_ID`` (a shard run alone, e.g. by a test or
a benchmark) there is nowhere to announce: the shard serves, restores and checkpoints
all the same (one shard only, as shards find each other through the store), and says
nothing. A restart with the same arguments is correct: the driver needs nothing else.

With ``--replicas 1`` a primary keeps its backup in step (``mirror.py``): every reply to
a data call waits until the backup holds every change made before it. A process
started with ``--backup`` is that backup (``backup.py``) until the driver promotes it,
and then serves the shard as its primary.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from typing import Callable

from ps import wire
from ps.errors import (
    PSConfigError,
    PSHeaderError,
    PSNotReadyError,
    PSReplicaError,
    PSWrongShardError,
)
from ps.partition import Slice
from ps.protocol import (
    APPLIED,
    CONTROL_CALLS,
    SERVICE,
    AttachArgs,
    Call,
    CreateArgs,
    Created,
    Empty,
    Envelope,
    Hello,
    MirrorArgs,
    PullArgs,
    PushArgs,
    ReleaseArgs,
    Restored,
    Sealed,
    StepArgs,
    StepReply,
)
from ps.registry import StoreRegistry
from ps.settings import ServerSettings
from ps.shard.backup import Backup, BackupHooks
from ps.shard.bulk import BulkServer
from ps.shard.checkpoint_format import Manifest
from ps.shard.control import Peers, ShardControl
from ps.shard.coordinator import Coordinator
from ps.shard.lifecycle import finish, restore
from ps.shard.mirror import Mirror
from ps.shard.staging import Staging
from ps.shard.state import ShardState
from rendezvous.errors import RendezvousError
from rendezvous.net import auth
from rendezvous.net.rpc import RpcServer, ServerLimits
from rendezvous.net.rpc_wire import frame, unframe
from rendezvous.net.url import Endpoint
from rendezvous.schema.ps import CheckpointFailedRecord, CheckpointRecord, RollbackRecord, ShardInfo

log = logging.getLogger("ps.shard.server")
#: the largest gRPC request a shard accepts (payloads above chunk_bytes use the bulk port)
MAX_MESSAGE_BYTES = 16 << 20
_PATIENCE = 30.0  # how long a data call waits at a paused gate before "not ready"
# The calls whose replies say what the state is: each waits until the backup holds it.
_DATA_CALLS = frozenset({"Describe", "Create", "Pull", "Push", "WaitStep"})
_BACKUP_CALLS = frozenset({"Hello", "Mirror"})  # all a backup serves

# A request handler: (envelope, whole header, payload) -> reply frame
Handler = Callable[[Envelope, dict, memoryview], bytes]


class ShardServer:
    """One shard (or its backup): state, RPC handlers, and (shard 0) the coordinator.
    ``registry`` is where it announces itself (None: nowhere, see the module doc);
    ``on_end()`` is called when the process stops serving on its own (``ended`` says
    why: deposed as a primary, or dropped as a backup).

    Raises:
        PSConfigError: shards of a multi-shard job that must reach each other
            (checkpoints, sync mode), or replicas, but have no registry.
        OSError: the bulk port cannot be bound."""

    def __init__(
        self,
        settings: ServerSettings,
        secret: str,
        registry: StoreRegistry | None = None,
        on_end: Callable[[], None] = lambda: None,
    ):
        if registry is None and (
            settings.replicas
            or (settings.num_shards > 1 and (settings.checkpoint_dir or settings.mode == "sync"))
        ):
            raise PSConfigError(
                "shards of a multi-shard job, and replicas, find each other through the "
                "rendezvous store (for checkpoints, sync rollbacks and backups): set "
                "ELASTIC_RENDEZVOUS and ELASTIC_JOB_ID"
            )
        self.settings = settings
        self.registry = registry
        self.role = "backup" if settings.backup else "primary"
        self.ended: str | None = None
        self._on_end = on_end
        self.state = ShardState(settings.index, settings.num_shards, settings.mode)
        self.staging = Staging(settings.staging_ttl)
        self.control = ShardControl(self.state, settings)
        self.peers = Peers(settings, secret, registry.lookup) if registry is not None else None
        self.coordinator = None
        if settings.index == 0:
            self.coordinator = Coordinator(
                settings,
                self.control,
                self.peers,
                self._announce,
                self._report_rollback,
                self._report_checkpoint_failure,
            )
        self.mirror: Mirror | None = None
        self.backup: Backup | None = None
        if registry is not None and settings.replicas:
            self.mirror = Mirror(
                settings, secret, self.state, registry, lambda: self.address, self._end
            )
        if registry is not None and settings.backup:
            hooks = BackupHooks(lambda: self.address, self.info, self._promoted, self._end)
            self.backup = Backup(settings, secret, self.state, registry, hooks)
        # Requests carry headers and payloads below ClientSettings.chunk_bytes (larger ones
        # travel on the bulk port), so a message never needs more than MAX_MESSAGE_BYTES.
        self._rpc = RpcServer(
            SERVICE,
            secret,
            settings.bind,
            ServerLimits(max_message_bytes=MAX_MESSAGE_BYTES, max_workers=64),
        )
        self.bulk = BulkServer(
            secret, settings.bind_endpoint.host, self.staging, limits=settings.bulk
        )
        handlers: dict[str, Handler] = {
            "Hello": self._hello,
            "Describe": self._describe,
            "Create": self._create,
            "Pull": self._pull,
            "Push": self._push,
            "WaitStep": self._wait_step,
            "Release": self._release,
            "RestoreAll": self._restore_all,
            "Seal": self._seal,
            "Attach": self._attach,
            "Mirror": self._mirror,
        }
        for call in CONTROL_CALLS:
            handlers[call.name] = self._control_handler(call)
        for name, handler in handlers.items():
            self._rpc.add_unary(name, self._serving(name, handler))
        self.address: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- handlers
    def _serving(self, name: str, handler: Handler) -> Callable[[bytes], bytes]:
        """The RPC handler of call ``name``: checks the envelope and this process's
        role, takes a staged upload, calls ``handler``; a data call's reply waits until
        the backup holds what it says."""
        wait = self.settings.mirror_timeout + self.settings.mirror_patience + 1.0

        def handle(request: bytes) -> bytes:
            header, body = unframe(request)
            envelope = Envelope.from_dict(header)
            if envelope.shard != self.settings.index:
                raise PSWrongShardError(
                    f"this is ps shard {self.settings.index}, not {envelope.shard}"
                )
            self._check_role(name)
            if envelope.upload is not None:
                body = self.staging.take_upload(envelope.upload)
            reply = handler(envelope, header, body)
            if self.mirror is not None and name in _DATA_CALLS:
                self.mirror.wait(self.mirror.last(), wait)
            return reply

        return handle

    def _check_role(self, name: str) -> None:
        """Raises PSWrongShardError for a call this process does not serve now (the
        caller re-reads the shard's address), PSReplicaError for an update sent to a
        process that is no backup."""
        if self.ended is not None:
            raise PSWrongShardError(
                f"this process no longer serves ps shard {self.settings.index}: {self.ended}"
            )
        if self.role == "backup" and name not in _BACKUP_CALLS:
            raise PSWrongShardError(
                f"this is the backup of ps shard {self.settings.index}, not the shard"
            )
        if self.role == "primary" and name == "Mirror":
            raise PSReplicaError(f"this process serves ps shard {self.settings.index}")

    @staticmethod
    def _grads(body) -> list:
        _, tensors = wire.decode(body)
        return [(meta["name"], array) for meta, array in tensors]

    def _hello(self, envelope: Envelope, header: dict, body) -> bytes:
        return frame(Hello(self.settings.index, self.bulk.port).to_dict())

    def _describe(self, envelope: Envelope, header: dict, body) -> bytes:
        described = replace(self.state.describe(), split_threshold=self.settings.split_threshold)
        return frame(described.to_dict())

    def _create(self, envelope: Envelope, header: dict, body) -> bytes:
        args = CreateArgs.from_dict(header)
        _, tensors = wire.decode(body)
        entries = [(Slice.from_dict(meta["slice"]), array) for meta, array in tensors]
        for sl, _ in entries:
            wire.check_dtype(sl.dtype)  # a variable holds numbers, whatever a client says
        return frame(
            Created(tuple(self.state.create(entries, args.optimizer, _PATIENCE))).to_dict()
        )

    def _pull(self, envelope: Envelope, header: dict, body) -> bytes:
        args = PullArgs.from_dict(header)
        pulled, tensors = self.state.pull(None if args.names is None else list(args.names))
        metas, blobs = wire.layout(tensors)
        inline_max = envelope.inline_max if envelope.inline_max is not None else 1 << 62
        return self.staging.reply({**pulled.to_dict(), wire.TENSORS: metas}, blobs, inline_max)

    def _push(self, envelope: Envelope, header: dict, body) -> bytes:
        grads = self._grads(body)
        if self.settings.mode == "async":
            args = PushArgs.from_dict(header)
            step = self.state.push_async(args.client, args.seq, grads, _PATIENCE, args.round)
            return frame(StepReply(APPLIED, step, self.state.generation).to_dict())
        sync = StepArgs.from_dict(header)
        return frame(
            self.state.push_sync(
                sync.round,
                sync.size,
                sync.rank,
                sync.step,
                sync.generation,
                grads,
                min(sync.wait, self.settings.max_wait),
            ).to_dict()
        )

    def _wait_step(self, envelope: Envelope, header: dict, body) -> bytes:
        sync = StepArgs.from_dict(header)
        return frame(
            self.state.wait_step(
                sync.round,
                sync.rank,
                sync.step,
                sync.generation,
                min(sync.wait, self.settings.max_wait),
            ).to_dict()
        )

    def _release(self, envelope: Envelope, header: dict, body) -> bytes:
        self.staging.release(ReleaseArgs.from_dict(header).id)
        return frame(Empty().to_dict())

    def _restore_all(self, envelope: Envelope, header: dict, body) -> bytes:
        if self.coordinator is None:
            raise PSConfigError("RestoreAll is served by shard 0 only")
        checkpoint_id, generation = self.coordinator.restore_all()
        return frame(Restored(checkpoint_id, generation).to_dict())

    def _seal(self, envelope: Envelope, header: dict, body) -> bytes:
        if self.coordinator is None:
            raise PSConfigError("Seal is served by shard 0 only")
        manifest = self.coordinator.seal(time.monotonic() + self.settings.stop_timeout, final=False)
        if manifest is None:
            return frame(Sealed(None, None).to_dict())
        return frame(Sealed(manifest.checkpoint_id, manifest.step).to_dict())

    def _attach(self, envelope: Envelope, header: dict, body) -> bytes:
        if self.mirror is None:
            raise PSConfigError(f"ps shard {self.settings.index} runs without a backup")
        if not self.state.loaded:
            raise PSNotReadyError(f"ps shard {self.settings.index} is restoring its state")
        args = AttachArgs.from_dict(header)
        if args.incarnation and not auth.is_incarnation(args.incarnation):
            raise PSHeaderError(f"bad AttachArgs header: {args.incarnation!r} is no incarnation")
        self.mirror.attach(args.address, args.token, args.incarnation or None)
        return frame(Empty().to_dict())

    def _mirror(self, envelope: Envelope, header: dict, body) -> bytes:
        if self.backup is None:
            raise PSReplicaError(f"this process is no backup of ps shard {self.settings.index}")
        return frame(self.backup.handle(MirrorArgs.from_dict(header), body).to_dict())

    def _control_handler(self, call: Call) -> Handler:
        def handle(envelope: Envelope, header: dict, body) -> bytes:
            return frame(self.control.handle(call, call.args.from_dict(header)).to_dict())

        return handle

    # ---------------------------------------------------------------- life cycle
    def start(self) -> str:
        """Serve, and announce the address (not ready yet).

        Raises:
            RendezvousError: the bind failed, or the store stayed unreachable."""
        self.address = self._rpc.start()
        self.bulk.start()
        if self.backup is not None:
            self.backup.start()
        else:
            self._publish(ready=False)
        return self.address

    def info(self, ready: bool) -> ShardInfo:
        """This shard's record in the store: with the incarnation of its gRPC server
        (fresh at every start, a backup's its own), which clients make their proofs
        for, so that no call made to a process before this one is taken by it."""
        bulk = Endpoint(self.settings.bind_endpoint.host, self.bulk.port)
        return ShardInfo(
            self.settings.index,
            self.settings.num_shards,
            str(self.address),
            os.getpid(),
            ready,
            str(bulk),
            self._rpc.incarnation,
        )

    def _publish(self, ready: bool) -> None:
        if self.registry is not None:
            self.registry.publish(self.info(ready))

    def announce_ready(self) -> None:
        """Say in the store that this shard is restored and serving (with replicas: who
        holds it first, so that its backup attaches).

        Raises:
            RendezvousError: the store stayed unreachable past its deadline."""
        if self.mirror is not None:
            self.state.journal = self.mirror.record
            self.mirror.serve()
        self._publish(ready=True)
        log.info("shard %d serving at %s", self.settings.index, self.address)

    def _promoted(self, revision: int) -> None:
        """This backup took the shard over (the replica record says so, at
        ``revision``): serve it, and announce it where clients look."""
        if self.mirror is None:  # a backup always has one (``--backup`` needs replicas)
            raise PSConfigError("a backup without replicas")
        self.state.journal = self.mirror.record
        self.mirror.promoted(revision)
        self.role = "primary"
        self.run_background()
        try:
            self._publish(ready=True)
        except RendezvousError as exc:  # clients find it once the store is back
            log.warning("shard %d not announced yet: %s", self.settings.index, exc)
        log.info("shard %d serving at %s (was its backup)", self.settings.index, self.address)

    def _end(self, reason: str) -> None:
        """The process stops serving on its own (deposed, or dropped as a backup)."""
        self.ended = self.ended or reason
        log.warning("stopping: %s", reason)
        self._on_end()

    def restore(self) -> None:
        """Restore the state for this start (``lifecycle.restore``). Raises
        PSCheckpointError only if a checkpoint disappears between verification and
        reading."""
        restore(self.settings, self.state, self.coordinator, self.peers, self._report_rollback)

    def run_background(self) -> None:
        if self.coordinator is not None and self.settings.checkpoint_dir:
            t = threading.Thread(
                target=self.coordinator.run, args=(self._stop,), name="ps-checkpoints", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _report_rollback(self, record: RollbackRecord) -> None:
        """The shards went back to an older state than they had reached: say so in the
        store, where the driver reports it (when there is one)."""
        log.warning(
            "ps shards back at step %d, from step %d (shard %d restarted)",
            record.to_step,
            record.from_step,
            record.shard,
        )
        if self.registry is not None:
            try:
                self.registry.publish_rollback(record)
            except RendezvousError as exc:
                log.warning("rollback not announced in the store: %s", exc)

    def _announce(self, manifest: Manifest, pause_ms: float, write_ms: float, final: bool) -> None:
        """A coordinated checkpoint is complete (``final``: it holds the state the
        shards stop with): say so in the store (when there is one)."""
        if self.registry is None:
            return
        record = CheckpointRecord(
            manifest.checkpoint_id,
            manifest.step,
            str(self.settings.checkpoint_dir),
            round(pause_ms, 1),
            round(write_ms, 1),
            final,
        )
        try:
            self.registry.publish_checkpoint(record)
        except RendezvousError as exc:  # the checkpoint itself is complete on disk
            log.warning("checkpoint %d not announced in the store: %s", manifest.checkpoint_id, exc)

    def _report_checkpoint_failure(self, record: CheckpointFailedRecord) -> None:
        """Checkpoints fail (``shard.failures`` decides when to say it; it logged it):
        say so in the store, where the driver reports it (when there is one)."""
        if self.registry is None:
            return
        try:
            self.registry.publish_checkpoint_failure(record)
        except RendezvousError as exc:
            log.warning("checkpoint failure not announced in the store: %s", exc)

    def finish(self) -> None:
        """Before the shard stops: the checkpoint that seals the shards' state
        (``lifecycle.finish``); nothing for a backup, or a process that stopped serving."""
        self._stop.set()  # no periodic checkpoint from now on: it would lift the seal
        if self.role == "primary" and self.ended is None:
            finish(self.settings, self.state, self.coordinator, self.peers)

    def stop(self) -> None:
        self._stop.set()
        self.state.close()  # handlers waiting at the gate answer now
        for part in (self.backup, self.mirror):
            if part is not None:
                part.close()
        self._rpc.stop(grace=0.5)
        self.bulk.close()
        for t in self._threads:
            t.join(timeout=5)
        if self.coordinator is not None:
            self.coordinator.close()
        self.control.close()
        if self.peers is not None:
            self.peers.close()
        if self.registry is not None:
            self.registry.close()
