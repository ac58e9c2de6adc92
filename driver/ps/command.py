"""The command line of a ps shard, and of its backup (pure): ``python -m
ps.server`` with the job's ps settings (the driver starts a command; it never
imports ``elastic``)."""

from __future__ import annotations

import sys

FINAL_CHECKPOINT_TIMEOUT = 20.0
"""Seconds a stopping shard tries to checkpoint the shards' state (``--stop-timeout``)."""

BACKUP_FLAG = "--backup"  # added to a shard's command line: start as its backup


def shard_command(
    index: int,
    num_shards: int,
    mode: str,
    bind_host: str,
    checkpoint_dir: str | None,
    checkpoint_interval: float,
    replicas: int = 0,
    verbose: bool = False,
) -> tuple[str, ...]:
    """The command line of shard ``index`` (pure); its backup's adds ``BACKUP_FLAG``.
    ``verbose``: it says what it does (elastic-run's -v), not only what goes wrong."""
    command = [
        sys.executable,
        "-m",
        "ps.server",
        "--index",
        str(index),
        "--num-shards",
        str(num_shards),
        "--mode",
        mode,
        "--bind",
        f"{bind_host}:0",
    ]
    if checkpoint_dir:
        command += [
            "--checkpoint-dir",
            checkpoint_dir,
            "--checkpoint-interval",
            str(checkpoint_interval),
            "--stop-timeout",
            f"{FINAL_CHECKPOINT_TIMEOUT:g}",
        ]
    if replicas:
        command += ["--replicas", str(replicas)]
    if verbose:
        command.append("--verbose")
    return tuple(command)
