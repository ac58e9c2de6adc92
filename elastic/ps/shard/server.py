"""A parameter-server shard process.

    ELASTIC_JOB_SECRET=... [ELASTIC_RENDEZVOUS=... ELASTIC_JOB_ID=...] \\
    python -m elastic.ps.server --index I --num-shards N [--mode async|sync] \\
        [--bind HOST:PORT] [--checkpoint-dir DIR --checkpoint-interval SEC]

Start-up: serve (control calls at once; data calls answer "not ready" until the state
is restored), publish the address in the store when one is configured, restore
(async: the newest complete checkpoint; sync: shard 0 brings every shard to the newest
complete checkpoint, see coordinator.py), then print one line on stdout::

    ELASTIC_PS_READY {"index": I, "address": "HOST:PORT", "num_shards": N, "pid": P}

Shard 0 checkpoints every ``--checkpoint-interval`` seconds and prints, for each one,
``ELASTIC_PS_CHECKPOINT {"checkpoint_id": K, "step": S, "dir": DIR, "pause_ms": P,
"write_ms": W}`` (how long training was paused, and how long the files took).
A restart with the same arguments is correct: the driver needs nothing else.
Exit status: 0 after SIGTERM/SIGINT, 2 for bad arguments or a missing secret.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from elastic.orphan import exit_when_orphaned
from elastic.ps import wire
from elastic.ps.bulk import BulkServer
from elastic.ps.shard.checkpoint import load_newest
from elastic.ps.shard.control import Peers, ShardControl
from elastic.ps.shard.coordinator import Coordinator
from elastic.ps.errors import PSConfigError, PSError
from elastic.ps.memory import tune_malloc
from elastic.ps.partition import Slice
from elastic.ps.registry import registry_from_env
from elastic.ps.settings import DEFAULT_SPLIT_THRESHOLD, ServerSettings
from elastic.ps.shard.state import ShardState, initial_generation
from elastic.ps.client.link import SERVICE, Staging, parse_request
from rendezvous.env import ENV_RENDEZVOUS
from rendezvous import auth
from rendezvous.rpc import RpcServer, frame

log = logging.getLogger("elastic.ps.server")
READY_PREFIX = "ELASTIC_PS_READY"
CHECKPOINT_PREFIX = "ELASTIC_PS_CHECKPOINT"
_PATIENCE = 30.0  # how long a data call waits at a paused gate before "not ready"


class ShardServer:
    """One shard: state, RPC handlers, and (shard 0) the coordinator."""

    def __init__(self, settings: ServerSettings, secret: str, registry=None):
        if settings.num_shards > 1 and registry is None and (
                settings.checkpoint_dir or settings.mode == "sync"):
            raise PSConfigError(
                "shards of a multi-shard job find each other through the rendezvous store "
                "(for checkpoints and sync rollbacks): set ELASTIC_RENDEZVOUS and ELASTIC_JOB_ID")
        self.settings = settings
        self.registry = registry
        self.state = ShardState(settings.index, settings.num_shards, settings.mode)
        self.staging = Staging(settings.staging_ttl)
        self.control = ShardControl(self.state, settings)
        self.peers = Peers(settings, secret, registry.lookup) if registry is not None else None
        self.coordinator = None
        if settings.index == 0:
            self.coordinator = Coordinator(settings, self.control, self.peers, self._announce)
        self._rpc = RpcServer(SERVICE, secret, settings.bind, max_workers=64)
        self.bulk = None
        if settings.bulk:
            self.bulk = BulkServer(secret, settings.bind.rpartition(":")[0].strip("[]") or "127.0.0.1",
                                   self.staging)
        for name in ("Hello", "Describe", "Create", "Pull", "Push", "WaitStep", "Upload", "Download",
                     "Release", "RestoreAll", *ShardControl.OPS):
            self._rpc.add_unary(name, getattr(self, "_h_" + name.lower(), None)
                                or self._control_handler(name))
        self.address: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- handlers
    def _parse(self, request: bytes) -> tuple[dict, object]:
        header, body = parse_request(request, self.settings.index)
        if "upload" in header:
            body = self.staging.take_upload(header["upload"])
        return header, body

    def _grads(self, body) -> list:
        _, tensors = wire.decode(body)
        return [(meta["name"], array) for meta, array in tensors]

    def _h_hello(self, request: bytes) -> bytes:
        parse_request(request, self.settings.index)
        return frame({"index": self.settings.index,
                      "bulk_port": self.bulk.port if self.bulk is not None else None})

    def _h_describe(self, request: bytes) -> bytes:
        self._parse(request)
        return frame({**self.state.describe(), "split_threshold": self.settings.split_threshold})

    def _h_create(self, request: bytes) -> bytes:
        header, body = self._parse(request)
        _, tensors = wire.decode(body)
        entries = [(Slice.from_dict(meta["slice"]), array) for meta, array in tensors]
        created = self.state.create(entries, header["optimizer"], _PATIENCE)
        return frame({"created": created})

    def _h_pull(self, request: bytes) -> bytes:
        header, _ = self._parse(request)
        state_header, tensors = self.state.pull(header.get("names"))
        metas, blobs = wire.layout(tensors)
        return self.staging.reply({**state_header, "tensors": metas}, blobs,
                                  int(header.get("inline_max", 1 << 62)))

    def _h_push(self, request: bytes) -> bytes:
        header, body = self._parse(request)
        grads = self._grads(body)
        if self.settings.mode == "async":
            step = self.state.push_async(str(header["client"]), int(header["seq"]), grads, _PATIENCE)
            return frame({"status": "applied", "step": step, "generation": self.state.generation})
        reply = self.state.push_sync(int(header["round"]), int(header["size"]), int(header["rank"]),
                                     int(header["step"]), str(header["generation"]), grads,
                                     min(float(header.get("wait", 0.0)), self.settings.max_wait))
        return frame(reply)

    def _h_waitstep(self, request: bytes) -> bytes:
        header, _ = self._parse(request)
        return frame(self.state.wait_step(int(header["round"]), int(header["rank"]),
                                          int(header["step"]), str(header["generation"]),
                                          min(float(header.get("wait", 0.0)), self.settings.max_wait)))

    def _h_upload(self, request: bytes) -> bytes:
        header, body = parse_request(request, self.settings.index)
        self.staging.upload_part(header, body)
        return frame({})

    def _h_download(self, request: bytes) -> bytes:
        header, _ = parse_request(request, self.settings.index)
        return self.staging.download_part(header)

    def _h_release(self, request: bytes) -> bytes:
        header, _ = parse_request(request, self.settings.index)
        self.staging.release(header["id"])
        return frame({})

    def _h_restoreall(self, request: bytes) -> bytes:
        self._parse(request)
        if self.coordinator is None:
            raise PSConfigError("RestoreAll is served by shard 0 only")
        checkpoint_id, generation = self.coordinator.restore_all()
        return frame({"checkpoint_id": checkpoint_id, "generation": generation})

    def _control_handler(self, op: str):
        def handle(request: bytes) -> bytes:
            header, _ = parse_request(request, self.settings.index)
            return frame(self.control.handle(op, header))
        return handle

    # ---------------------------------------------------------------- life cycle
    def start(self) -> str:
        """Serve and publish the address. Raises RendezvousError (bind or store)."""
        self.address = self._rpc.start()
        if self.bulk is not None:
            self.bulk.start()
        if self.registry is not None:
            self.registry.publish(self.settings.index, self.info())
        return self.address

    def info(self) -> dict:
        return {"index": self.settings.index, "num_shards": self.settings.num_shards,
                "address": self.address, "pid": os.getpid(), "mode": self.settings.mode}

    def restore(self) -> None:
        """Restore the state for this start (see module doc). Raises PSCheckpointError
        only if a checkpoint disappears between verification and reading."""
        s = self.settings
        if s.mode == "sync":
            if self.coordinator is not None:
                self.coordinator.restore_all()
            else:
                try:
                    self.peers.call(0, "RestoreAll", {}, retry_for=s.peer_deadline)
                except PSError as exc:
                    log.warning("shard 0 did not restore the shards (%s); loading alone", exc)
        if not self.state.loaded:
            loaded = load_newest(s.checkpoint_dir)
            snap = loaded.shard_snapshot(s.index, s.num_shards, s.split_threshold) if loaded else None
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
                    try:
                        steps.append(int(self.peers.call(i, "Status", {}, retry_for=0.0)["step"]))
                    except PSError:
                        pass
            if steps:
                self.state.raise_step(max(steps))

    def run_background(self) -> None:
        if self.coordinator is not None and self.settings.checkpoint_dir:
            t = threading.Thread(target=self.coordinator.run, args=(self._stop,),
                                 name="ps-checkpoints", daemon=True)
            t.start()
            self._threads.append(t)

    def _announce(self, manifest, pause_ms: float, write_ms: float) -> None:
        print(f"{CHECKPOINT_PREFIX} " + json.dumps(
            {"checkpoint_id": manifest.checkpoint_id, "step": manifest.step,
             "dir": self.settings.checkpoint_dir, "pause_ms": round(pause_ms, 1),
             "write_ms": round(write_ms, 1)}), flush=True)

    def stop(self) -> None:
        self._stop.set()
        self._rpc.stop(grace=0.5)
        if self.bulk is not None:
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
    p = argparse.ArgumentParser(prog="python -m elastic.ps.server",
                                description="Serve one parameter-server shard.")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--num-shards", type=int, required=True)
    p.add_argument("--mode", choices=("async", "sync"), default="async")
    p.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-interval", type=float, default=30.0)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--split-threshold", type=int, default=DEFAULT_SPLIT_THRESHOLD,
                   help="variables above this many bytes are split across shards")
    p.add_argument("--no-bulk", action="store_true",
                   help="move large payloads over gRPC only (no bulk TCP port)")
    a = p.parse_args(argv)
    try:
        return ServerSettings(index=a.index, num_shards=a.num_shards, mode=a.mode, bind=a.bind,
                              checkpoint_dir=a.checkpoint_dir,
                              checkpoint_interval=a.checkpoint_interval,
                              keep_checkpoints=a.keep_checkpoints, split_threshold=a.split_threshold,
                              bulk=not a.no_bulk)
    except PSConfigError as exc:
        p.error(str(exc))


def main(argv=None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[ps {settings.index}] %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    secret = auth.secret_from_env()
    if secret is None:
        print(f"elastic.ps.server: {auth.ENV_SECRET} is not set", file=sys.stderr)
        return 2
    if settings.checkpoint_dir:
        os.makedirs(settings.checkpoint_dir, exist_ok=True)
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
        print(f"{READY_PREFIX} " + json.dumps(server.info()), flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
