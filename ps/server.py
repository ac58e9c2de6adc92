"""The command line that starts one shard, or the backup of one (the driver's
``shard_command``):

    ELASTIC_JOB_SECRET=... [ELASTIC_RENDEZVOUS=... ELASTIC_JOB_ID=...] \\
    python -m ps.server --index I --num-shards N [--mode async|sync] \\
        [--bind HOST:PORT] [--checkpoint-dir DIR --checkpoint-interval SEC] \\
        [--replicas 0|1 [--backup]]

The shard itself is ``ps.shard.server``. Exit status: 0 after SIGTERM/SIGINT;
1 when the process stopped serving on its own (a primary whose backup the driver
promoted in its place, a backup its primary dropped); 2 for bad arguments, a missing
secret, or a checkpoint directory another user owns or can write
(``rendezvous.private_dir``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from elastic.orphan import exit_when_orphaned
from ps.errors import PSConfigError
from ps.memory import tune_malloc
from ps.registry import registry_from_env
from ps.settings import DEFAULT_SPLIT_THRESHOLD, MODES, ServerSettings
from ps.shard.server import ShardServer
from rendezvous.env import ENV_RENDEZVOUS
from rendezvous.net import auth
from rendezvous.private_dir import InsecureDirectoryError, make_private_dir
from rendezvous.process_exit import run_then_exit
from rendezvous.resources import raise_fd_limit
from rendezvous.signals import relay_signals


def parse_args(argv=None) -> tuple[ServerSettings, bool]:
    """The shard's settings from its command line, and whether to say what it does
    (``--verbose``); exits 2 with a one-line error for bad arguments (argparse)."""
    p = argparse.ArgumentParser(
        prog="python -m ps.server", description="Serve one parameter-server shard."
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
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="1: every update is mirrored to the shard's backup before it is acknowledged",
    )
    p.add_argument(
        "--backup",
        action="store_true",
        help="start as the backup of shard INDEX (needs --replicas 1)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="say what it does (INFO lines), also under elastic-run (which passes it with -v)",
    )
    a = p.parse_args(argv)
    try:
        settings = ServerSettings(
            index=a.index,
            num_shards=a.num_shards,
            mode=a.mode,
            bind=a.bind,
            checkpoint_dir=a.checkpoint_dir,
            checkpoint_interval=a.checkpoint_interval,
            keep_checkpoints=a.keep_checkpoints,
            stop_timeout=a.stop_timeout,
            split_threshold=a.split_threshold,
            replicas=a.replicas,
            backup=a.backup,
        )
    except PSConfigError as exc:
        p.error(str(exc))
        raise  # not reached: error() exits
    return settings, a.verbose


def main(argv=None) -> int:
    settings, verbose = parse_args(argv)
    role = " backup" if settings.backup else ""
    # Under elastic-run the driver prefixes each line with the shard's name already, and
    # a healthy run says nothing: warnings only. Run by hand: its name, and what it does.
    under_job = bool(os.environ.get(ENV_RENDEZVOUS))
    logging.basicConfig(
        level=logging.INFO if verbose or not under_job else logging.WARNING,
        stream=sys.stderr,
        format=("" if under_job else f"[ps {settings.index}{role}] ")
        + "%(levelname)s %(name)s: %(message)s",
    )
    tune_malloc()
    raise_fd_limit()  # before the servers: their caps are shares of it (rendezvous.resources)
    secret = auth.secret_from_env()
    if secret is None:
        print(f"ps.server: {auth.ENV_SECRET} is not set", file=sys.stderr)
        return 2
    if settings.checkpoint_dir:
        try:
            make_private_dir(settings.checkpoint_dir, "--checkpoint-dir")
        except InsecureDirectoryError as exc:
            print(f"ps.server: {exc}", file=sys.stderr)
            return 2
    stop = threading.Event()  # SIGTERM/SIGINT, or the process stops serving on its own
    relay_signals((signal.SIGINT, signal.SIGTERM), lambda _signum: stop.set())
    if os.environ.get(ENV_RENDEZVOUS):
        exit_when_orphaned()  # started by elastic-run: do not outlive it
    try:
        server = ShardServer(settings, secret, registry_from_env(), on_end=stop.set)
    except PSConfigError as exc:
        print(f"ps.server: {exc}", file=sys.stderr)
        return 2
    try:
        server.start()
        if not settings.backup:
            server.restore()
            server.run_background()
            server.announce_ready()
        stop.wait()
        if server.ended is not None:
            return 1
        server.finish()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no finalization to hang in (rendezvous.process_exit)
