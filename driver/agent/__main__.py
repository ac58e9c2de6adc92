"""``python -m driver.agent --job-id ID --host LABEL [--driver-timeout SEC] [--detach]
[--slots N]``.

The store's URL and the job's secret come from the environment (``ELASTIC_RENDEZVOUS``,
``ELASTIC_JOB_SECRET``), as for every process of the job. ``--detach``: leave the
session the agent was started in (its ssh session, the driver's process group), so
that the driver's death does not end the agent: used with an etcd store, where the job
can outlive its driver. Output of the processes goes to stdout and to ``--log-file``
(default with ``--detach``: ``JOB-HOST.log`` in ``elastic-agent-logs-UID``, a folder
of mode 0700 of the agent's user in the temporary directory: ``default_log_path``),
whose path is in the agent's record.

Exit status: 0 once the agent stopped its processes (job over, SIGTERM, no driver for
``--driver-timeout``); 2 for bad arguments or environment; 1 when the store cannot be
used.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
from typing import BinaryIO, cast

from driver.agent.loop import Agent
from driver.agent.output import Tee, close_quietly, open_log
from driver.agent.settings import DEFAULT_DRIVER_TIMEOUT, AgentIdentity, AgentTimings
from driver.launch.local import LocalLauncher
from rendezvous import env, open_store
from rendezvous.errors import ElasticError
from rendezvous.keys import JobKeys
from rendezvous.private_dir import InsecureDirectoryError, make_private_dir
from rendezvous.process_exit import run_then_exit
from rendezvous.signals import relay_signals
from rendezvous.store import StoreSettings

AGENT_STORE = StoreSettings(request_timeout=1.0)
"""The agent's calls give up an attempt after a second (and retry, or move to the next
etcd member): its lease is short (``AGENT_LEASE_TTL``), and after an etcd member dies a
refresh must reach another member well within it."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m driver.agent", description=__doc__.splitlines()[0])
    p.add_argument("--job-id", required=True, metavar="ID")
    p.add_argument("--host", required=True, metavar="LABEL", help="the host name the job uses")
    p.add_argument(
        "--driver-timeout",
        type=_seconds,
        default=DEFAULT_DRIVER_TIMEOUT,
        metavar="SEC",
        help="stop every process and exit after this long without a driver (default: %(default)s)",
    )
    p.add_argument("--detach", action="store_true", help="outlive the session started in")
    p.add_argument("--log-file", metavar="PATH", help="also write the output here")
    p.add_argument("--agent-id", default="", help="said in the agent's record")
    p.add_argument(
        "--slots",
        type=int,
        default=0,
        metavar="N",
        help="the host joined the job with N slots (elastic-run --join; default: a driver "
        "started this agent)",
    )
    return p


def default_log_path(job_id: str, host: str) -> str:
    """``JOB-HOST.log`` in this user's own folder of agent logs under the temporary
    directory (``elastic-agent-logs-UID``, mode 0700: ``LOG_FOLDER_WHAT``), which
    nobody else can plant a file or a link in."""
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in host)
    folder = os.path.join(tempfile.gettempdir(), f"elastic-agent-logs-{os.geteuid()}")
    return os.path.join(folder, f"{job_id}-{safe}.log")


LOG_FOLDER_WHAT = "the agents' log folder"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"[agent {args.host}] %(levelname)s %(message)s",
    )
    url, secret = env.text(env.ENV_RENDEZVOUS), env.text(env.ENV_SECRET)
    if not url or not secret:
        print(f"agent: {env.ENV_RENDEZVOUS} and {env.ENV_SECRET} must be set", file=sys.stderr)
        return 2
    if args.detach:
        # Out of the ssh wrapper's (or the driver's) process group; a session leader
        # already (started locally in a new session) has nothing to leave.
        with contextlib.suppress(OSError):
            os.setsid()
    log_path = args.log_file or (default_log_path(args.job_id, args.host) if args.detach else "")
    try:
        if log_path and not args.log_file:
            make_private_dir(os.path.dirname(log_path), LOG_FOLDER_WHAT)
        log_file = open_log(log_path) if log_path else None
    except (OSError, InsecureDirectoryError) as exc:  # (planted, another user's: one line)
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    # Binary streams as far as the forwarders' write_line is concerned.
    out = cast(BinaryIO, Tee(sys.stdout.buffer, log_file))
    err = cast(BinaryIO, Tee(sys.stderr.buffer, log_file))
    try:
        store = open_store(url, secret, AGENT_STORE)
    except ElasticError as exc:
        print(f"agent: cannot use the store: {exc}", file=sys.stderr)
        return 1
    agent = Agent(
        store,
        JobKeys(args.job_id),
        AgentIdentity(args.host, os.getpid(), args.agent_id, log_path, max(0, args.slots)),
        launcher=LocalLauncher(out, err),
        timings=AgentTimings(driver_timeout=args.driver_timeout),
    )
    # SIGTERM is how a scheduler takes a host back (a preemption): the host drains first.
    # SIGINT stops at once.
    relay_signals(
        (signal.SIGTERM, signal.SIGINT),
        lambda s: (
            agent.request_drain("SIGTERM")
            if s == signal.SIGTERM
            else agent.request_shutdown("SIGINT")
        ),
    )
    if args.detach:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        agent.run()
    except ElasticError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
        close_quietly(log_file)
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no finalization to hang in (rendezvous.process_exit)
