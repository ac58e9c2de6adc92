"""Run the embedded store on its own: ``python -m rendezvous.server --bind HOST:PORT``.

The job secret comes from ``ELASTIC_JOB_SECRET`` (a new one is made and printed when
unset). Prints one line ``ELASTIC_STORE_READY embedded://HOST:PORT`` once serving, then
serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.errors import RendezvousError
from rendezvous.net import auth
from rendezvous.process_exit import run_then_exit
from rendezvous.resources import raise_fd_limit
from rendezvous.signals import relay_signals

READY_PREFIX = "ELASTIC_STORE_READY"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rendezvous.server", description="Serve the embedded rendezvous KV store."
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1:0",
        help="HOST:PORT to listen on (port 0: any free port; default %(default)s)",
    )
    args = parser.parse_args(argv)
    secret = auth.secret_from_env()
    if secret is None:
        secret = auth.make_secret()
        print(f"{auth.ENV_SECRET}={secret}", flush=True)
    raise_fd_limit()  # before the server: its cap is a share of it (rendezvous.resources)
    server = EmbeddedServer(secret, bind=args.bind)
    try:
        address = server.start()
    except RendezvousError as exc:
        print(f"rendezvous.server: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    relay_signals((signal.SIGINT, signal.SIGTERM), lambda _signum: stop.set())
    print(f"{READY_PREFIX} embedded://{address}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no finalization to hang in (rendezvous.process_exit)
