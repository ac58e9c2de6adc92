"""How a worker gets its client of the job's shards: ``connect()`` from the environment
elastic-run gives it (store URL, job id, secret; shard addresses from the store), with
round hooks that follow the worker's own runtime when it runs under one."""

from __future__ import annotations

import os

import elastic.context as context
from ps.client.client import PSClient
from ps.errors import PSConfigError
from ps.registry import registry_from_env, store_round_hooks
from ps.settings import ClientSettings
from rendezvous import env


def _runtime_hooks(fallback_source, fallback_newer):
    """Round hooks that follow the elastic runtime when this worker runs under one
    (the round the worker is actually in), else the store's published plan."""

    def runtime():
        rt = context.current_runtime()
        return rt if rt is not None and rt.plan is not None else None

    def round_source():
        rt = runtime()
        member = rt.member if rt is not None else None
        if member is not None:
            return rt.plan.round_id, rt.plan.size, member.rank
        return fallback_source() if fallback_source else None

    def newer_round(round_id: int) -> bool:
        rt = runtime()
        if rt is not None:
            return rt.newer_round_pending() or rt.round_id > round_id
        return bool(fallback_newer and fallback_newer(round_id))

    return round_source, newer_round


def connect(settings: ClientSettings | None = None, environ=os.environ) -> PSClient:
    """A client of this job's shards, from the environment elastic-run gives workers
    (store URL, job id, secret; the shard addresses from the store). Raises
    PSConfigError when the job has no shards or the environment is incomplete,
    RendezvousError when the store cannot be reached."""
    settings = settings or ClientSettings()
    secret = environ.get(env.ENV_SECRET)
    registry = registry_from_env(environ) if secret else None
    if registry is None or not secret:
        raise PSConfigError(
            "elastic.ps.connect() needs a job started by elastic-run --num-ps N "
            f"({env.ENV_RENDEZVOUS}, {env.ENV_JOB_ID} and {env.ENV_SECRET} "
            "must be set)"
        )
    try:
        shards = registry.wait_all(settings.connect_timeout)
    except BaseException:
        registry.close()
        raise
    worker_id = environ.get(env.ENV_WORKER_ID)
    source = newer = None
    if worker_id:
        source, newer = store_round_hooks(registry.store, environ[env.ENV_JOB_ID], worker_id)
    round_source, newer_round = _runtime_hooks(source, newer)
    return PSClient(
        shards,
        secret,
        settings,
        resolver=registry.lookup,
        round_source=round_source,
        newer_round=newer_round,
        on_close=[registry.close],
    )
