"""Who a worker is and how long it waits (``WorkerSettings``), read from the variables
``elastic-run`` set for it (``rendezvous.env``; ``from_env``).

Why apart from the runtime (``elastic.runtime``, which takes them): a missing or
malformed variable is refused here, in one line naming it, before anything opens a
socket or the store.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic.comm import CommSettings
from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.net import addresses


@dataclass(frozen=True)
class WorkerSettings:
    """Who this worker is and how long it waits; ``from_env`` reads what the driver set."""

    store_url: str
    job_id: str
    worker_id: str
    host: str
    slot: int
    secret: str
    bind_host: str = "127.0.0.1"
    round_timeout: float = 600.0  # waiting for a round that includes us
    lease_ttl: int = 10  # a slow keep-alive on a loaded host must not end a live registration
    progress_interval: float = 0.0  # seconds between progress records from rank 0 (0: none)
    comm: CommSettings = field(default_factory=CommSettings)
    spare: bool = False  # a warm spare: waits for its first round without a deadline
    agent_socket: str = ""  # its host agent's socket: it registers through it ("": itself)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """The settings elastic-run gave this worker (``environ`` defaults to os.environ).

        Raises:
            RendezvousConfigError: a variable is missing or malformed (the message names it).
        """

        def required(name: str) -> str:
            value = env.text(name, None, environ)
            if value is None:
                raise RendezvousConfigError(
                    f"{name} is not set: this worker was not started by elastic-run"
                )
            return value

        store_url = required(env.ENV_RENDEZVOUS)
        return cls(
            store_url=store_url,
            job_id=required(env.ENV_JOB_ID),
            worker_id=required(env.ENV_WORKER_ID),
            host=env.text(env.ENV_HOST, None, environ) or socket.gethostname(),
            slot=env.integer(env.ENV_SLOT, 0, environ, minimum=0),
            secret=required(env.ENV_SECRET),
            bind_host=env.text(env.ENV_BIND_HOST, None, environ)
            or addresses.address_toward_store(store_url),
            round_timeout=env.number(env.ENV_ROUND_TIMEOUT, 600.0, environ),
            lease_ttl=int(env.tuned(env.ENV_LEASE_TTL, 10, environ)),
            progress_interval=env.number(env.ENV_PROGRESS_INTERVAL, 0.0, environ, positive=False),
            spare=env.flag(env.ENV_SPARE, False, environ),
            agent_socket=env.text(env.ENV_AGENT_SOCKET, "", environ) or "",
            comm=CommSettings(
                peer_timeout=env.tuned(env.ENV_PEER_TIMEOUT, 30.0, environ),
                connect_timeout=env.tuned(env.ENV_CONNECT_TIMEOUT, 30.0, environ),
            ),
        )
