"""A parameter-server shard process.

    ELASTIC_JOB_SECRET=... [ELASTIC_RENDEZVOUS=... ELASTIC_JOB_ID=...] \\
    python -m elastic.ps.server --index I --num-shards N [--mode async|sync] \\
        [--bind HOST:PORT] [--checkpoint-dir DIR --checkpoint-interval SEC]

A shard announces itself and its checkpoints through the rendezvous store only
(``rendezvous.plan``'s records):

* as soon as it serves (control calls at once; data calls answer "not ready" until the
  state is restored), ``ShardInfo(ready=False)`` under ``JobKeys.ps_shard(I)``, so
  clients and peers find it while it restores;
* once restored (async: the newest complete checkpoint; sync: shard 0 brings every
  shard to the newest complete checkpoint, see coordinator.py), the same record with
  ``ready=True`` and the same pid: the driver's supervisor waits for that;
* shard 0 checkpoints every ``--checkpoint-interval`` seconds and, after each complete
  coordinated checkpoint, writes a ``CheckpointRecord`` (id, step, dir, how long
  training was paused and how long the files took) under ``JobKeys.ps_checkpoint``;
* on SIGTERM/SIGINT a shard puts the shards' state in a checkpoint that seals them
  before it exits (``ShardServer.finish``, within ``--stop-timeout``): shard 0 makes
  it and announces it with ``final`` set; another shard asks shard 0 for it.

Without ``ELASTIC_RENDEZVOUS``/``ELASTIC_JOB_ID`` (a shard run alone, e.g. by a test or
a benchmark) there is nowhere to announce: the shard serves, restores and checkpoints
all the same (one shard only, as shards find each other through the store), and says
nothing. A restart with the same arguments is correct: the driver needs nothing else.
Exit status: 0 after SIGTERM/SIGINT, 2 for bad arguments, a missing secret, or a
checkpoint directory another user owns or can write (``rendezvous.private_dir``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Callable

from elastic.orphan import exit_when_orphaned
from elastic.ps import wire
from elastic.ps.errors import PSConfigError, PSError, PSWrongShardError
from elastic.ps.memory import tune_malloc
from elastic.ps.partition import Slice
from elastic.ps.protocol import (
    APPLIED,
    CONTROL_CALLS,
    RESTORE_ALL,
    SEAL,
    SERVICE,
    STATUS,
    Call,
    CreateArgs,
    Created,
    Empty,
    Envelope,
    Hello,
    PullArgs,
    PushArgs,
    ReleaseArgs,
    Restored,
    Sealed,
    StepArgs,
    StepReply,
)
from elastic.ps.registry import StoreRegistry, registry_from_env
from elastic.ps.settings import DEFAULT_SPLIT_THRESHOLD, MODES, ServerSettings
from elastic.ps.shard.bulk import BulkServer
from elastic.ps.shard.checkpoint import Manifest, load_newest
from elastic.ps.shard.control import Peers, ShardControl
from elastic.ps.shard.coordinator import Coordinator
from elastic.ps.shard.staging import Staging
from elastic.ps.shard.state import ShardState, initial_generation
from rendezvous.env import ENV_RENDEZVOUS
from rendezvous.errors import RendezvousError
from rendezvous.net import auth
from rendezvous.net.rpc import RpcServer, ServerLimits, frame, unframe
from rendezvous.net.url import Endpoint
from rendezvous.plan import CheckpointRecord, ShardInfo
from rendezvous.private_dir import InsecureDirectoryError, make_private_dir

log = logging.getLogger("elastic.ps.shard.server")
#: the largest gRPC request a shard accepts (payloads above chunk_bytes use the bulk port)
MAX_MESSAGE_BYTES = 16 << 20
_PATIENCE = 30.0  # how long a data call waits at a paused gate before "not ready"

# A request handler: (envelope, whole header, payload) -> reply frame
Handler = Callable[[Envelope, dict, memoryview], bytes]


class ShardServer:
    """One shard: state, RPC handlers, and (shard 0) the coordinator. ``registry`` is
    where it announces itself (None: nowhere, see the module doc).

    Raises:
        PSConfigError: shards of a multi-shard job that must reach each other
            (checkpoints, sync mode) but have no registry.
        OSError: the bulk port cannot be bound."""

    def __init__(
        self, settings: ServerSettings, secret: str, registry: StoreRegistry | None = None
    ):
        if (
            settings.num_shards > 1
            and registry is None
            and (settings.checkpoint_dir or settings.mode == "sync")
        ):
            raise PSConfigError(
                "shards of a multi-shard job find each other through the rendezvous store "
                "(for checkpoints and sync rollbacks): set ELASTIC_RENDEZVOUS and ELASTIC_JOB_ID"
            )
        self.settings = settings
        self.registry = registry
        self.state = ShardState(settings.index, settings.num_shards, settings.mode)
        self.staging = Staging(settings.staging_ttl)
        self.control = ShardControl(self.state, settings)
        self.peers = Peers(settings, secret, registry.lookup) if registry is not None else None
        self.coordinator = None
        if settings.index == 0:
            self.coordinator = Coordinator(settings, self.control, self.peers, self._announce)
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
        }
        for call in CONTROL_CALLS:
            handlers[call.name] = self._control_handler(call)
        for name, handler in handlers.items():
            self._rpc.add_unary(name, self._serving(handler))
        self.address: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- handlers
    def _serving(self, handler: Handler) -> Callable[[bytes], bytes]:
        """The RPC handler: checks the envelope, takes a staged upload, calls ``handler``."""

        def handle(request: bytes) -> bytes:
            header, body = unframe(request)
            envelope = Envelope.from_dict(header)
            if envelope.shard != self.settings.index:
                raise PSWrongShardError(
                    f"this is ps shard {self.settings.index}, not {envelope.shard}"
                )
            if envelope.upload is not None:
                body = self.staging.take_upload(envelope.upload)
            return handler(envelope, header, body)

        return handle

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
        self._publish(ready=False)
        return self.address

    def info(self, ready: bool) -> ShardInfo:
        """This shard's record in the store."""
        bulk = Endpoint(self.settings.bind_endpoint.host, self.bulk.port)
        return ShardInfo(
            self.settings.index,
            self.settings.num_shards,
            str(self.address),
            os.getpid(),
            ready,
            str(bulk),
        )

    def _publish(self, ready: bool) -> None:
        if self.registry is not None:
            self.registry.publish(self.info(ready))

    def announce_ready(self) -> None:
        """Say in the store that this shard is restored and serving.

        Raises:
            RendezvousError: the store stayed unreachable past its deadline."""
        self._publish(ready=True)
        log.info("shard %d serving at %s", self.settings.index, self.address)

    def restore(self) -> None:
        """Restore the state for this start (see module doc). Raises PSCheckpointError
        only if a checkpoint disappears between verification and reading."""
        s = self.settings
        if s.mode == "sync":
            if self.coordinator is not None:
                self.coordinator.restore_all()
            elif self.peers is not None:
                try:
                    self.peers.call(0, RESTORE_ALL, Empty(), retry_for=s.peer_deadline)
                except PSError as exc:
                    log.warning("shard 0 did not restore the shards (%s); loading alone", exc)
        if not self.state.loaded:
            loaded = load_newest(s.checkpoint_dir)
            snap = (
                loaded.shard_snapshot(s.index, s.num_shards, s.split_threshold) if loaded else None
            )
            cid = loaded.checkpoint_id if loaded else None
            self.state.load(snap, cid, initial_generation(cid))
            if loaded:
                log.info("shard %d: loaded checkpoint %d (step %d)", s.index, cid, loaded.step)
        if s.mode == "async" and self.peers is not None:
            # Continue the others' step count (best effort, one attempt each: at a job's
            # start the peers may not be up, and then they are at this same step anyway).
            steps = []
            for i in range(s.num_shards):
                if i != s.index:
                    with contextlib.suppress(PSError):
                        steps.append(self.peers.call(i, STATUS, Empty(), retry_for=0.0).step)
            if steps:
                self.state.raise_step(max(steps))

    def run_background(self) -> None:
        if self.coordinator is not None and self.settings.checkpoint_dir:
            t = threading.Thread(
                target=self.coordinator.run, args=(self._stop,), name="ps-checkpoints", daemon=True
            )
            t.start()
            self._threads.append(t)

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

    def finish(self) -> None:
        """Before the shard stops: put the shards' state in a checkpoint that seals them
        (``Coordinator.seal``: no push is applied after it, so it holds the last step
        any client saw), when the job checkpoints at all. Shard 0 makes it and
        announces it as the final checkpoint. Another shard cannot make a coordinated
        checkpoint alone: it asks shard 0 for one, unless a seal already holds it (the
        driver stops shard 0 first, whose final checkpoint seals every shard), and
        without an answer it stops with what the newest checkpoint holds. Bounded by
        ``ServerSettings.stop_timeout``; the outcome is logged."""
        self._stop.set()  # no periodic checkpoint from now on: it would lift the seal
        s = self.settings
        if not s.checkpoint_dir or not self.state.loaded:
            return
        deadline = time.monotonic() + s.stop_timeout
        if self.coordinator is not None:
            manifest = self.coordinator.seal(deadline, final=True)
            if manifest is not None:
                log.info("final checkpoint %d holds step %d", manifest.checkpoint_id, manifest.step)
            return
        sealed = self.state.sealed_at()
        if sealed is None and self.peers is not None:
            try:
                reply = self.peers.call(0, SEAL, Empty(), retry_for=0.0, timeout=s.stop_timeout)
                sealed = reply.checkpoint_id
            except (PSError, RendezvousError) as exc:
                log.warning("shard 0 made no checkpoint for this stop: %s", exc)
                sealed = self.state.sealed_at()  # it may have, and then stopped itself
        if sealed is not None:
            log.info("shard %d: stopping with its state in checkpoint %d", s.index, sealed)
        else:
            log.warning(
                "shard %d stops with changes since the newest checkpoint; a restart "
                "restores that checkpoint",
                s.index,
            )

    def stop(self) -> None:
        self._stop.set()
        self.state.close()  # handlers waiting at the gate answer now
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


def parse_args(argv=None) -> ServerSettings:
    """The shard's settings from its command line; exits 2 with a one-line error for
    bad arguments (argparse)."""
    p = argparse.ArgumentParser(
        prog="python -m elastic.ps.server", description="Serve one parameter-server shard."
    )
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--num-shards", type=int, required=True)
    p.add_argument("--mode", choices=MODES, default="async")
    p.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-interval", type=float, default=30.0)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=ServerSettings.stop_timeout,
        help="seconds a stopping shard tries to checkpoint the shards' state",
    )
    p.add_argument(
        "--split-threshold",
        type=int,
        default=DEFAULT_SPLIT_THRESHOLD,
        help="variables above this many bytes are split across shards",
    )
    a = p.parse_args(argv)
    try:
        return ServerSettings(
            index=a.index,
            num_shards=a.num_shards,
            mode=a.mode,
            bind=a.bind,
            checkpoint_dir=a.checkpoint_dir,
            checkpoint_interval=a.checkpoint_interval,
            keep_checkpoints=a.keep_checkpoints,
            stop_timeout=a.stop_timeout,
            split_threshold=a.split_threshold,
        )
    except PSConfigError as exc:
        p.error(str(exc))
        raise  # not reached: error() exits


def main(argv=None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"[ps {settings.index}] %(levelname)s %(name)s: %(message)s",
    )
    tune_malloc()
    secret = auth.secret_from_env()
    if secret is None:
        print(f"elastic.ps.server: {auth.ENV_SECRET} is not set", file=sys.stderr)
        return 2
    if settings.checkpoint_dir:
        try:
            make_private_dir(settings.checkpoint_dir, "--checkpoint-dir")
        except InsecureDirectoryError as exc:
            print(f"elastic.ps.server: {exc}", file=sys.stderr)
            return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if os.environ.get(ENV_RENDEZVOUS):
        exit_when_orphaned()  # started by elastic-run: do not outlive it
    try:
        server = ShardServer(settings, secret, registry_from_env())
    except PSConfigError as exc:
        print(f"elastic.ps.server: {exc}", file=sys.stderr)
        return 2
    try:
        server.start()
        server.restore()
        server.run_background()
        server.announce_ready()
        stop.wait()
        server.finish()
    finally:
        server.stop()
    return 0
