"""Where shards are found: their addresses (and, for sync workers, the current round)
in the rendezvous store, under ``JobKeys(job_id).ps_shard(i)``.

A shard publishes ``{"index", "num_shards", "address", "pid"}`` as soon as it
serves (it may still be restoring: data calls answer "not ready" until it is);
a restarted shard overwrites its key, and clients and peers re-read it after a failure.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

from elastic.ps.errors import PSConfigError
from rendezvous import env
from rendezvous.keys import JobKeys
from rendezvous.plan import Plan


class StoreRegistry:
    """Shard addresses in the store of job ``job_id`` (the registry owns ``store``)."""

    def __init__(self, store, job_id: str):
        self.store = store
        self.keys = JobKeys(job_id)

    def publish(self, index: int, info: dict) -> None:
        """Raises RendezvousError when the store stays unreachable past its deadline."""
        self.store.put(self.keys.ps_shard(index), json.dumps(info, sort_keys=True).encode())

    def lookup(self, index: int) -> str | None:
        kv = self.store.get(self.keys.ps_shard(index))
        return json.loads(kv.value)["address"] if kv is not None else None

    def shards(self) -> dict[int, dict]:
        kvs, _ = self.store.get_prefix(self.keys.ps)
        out = {}
        for kv in kvs:
            info = json.loads(kv.value)
            out[int(info["index"])] = info
        return out

    def wait_all(self, timeout: float) -> list[str]:
        """Every shard's address, in index order, once all have published. Raises
        PSConfigError when none has within ``timeout`` (a job without shards), or
        when some are still missing then."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            shards = self.shards()
            if shards:
                n = int(next(iter(shards.values()))["num_shards"])
                if all(i in shards for i in range(n)):
                    return [shards[i]["address"] for i in range(n)]
            if time.monotonic() >= deadline:
                if not shards:
                    raise PSConfigError(
                        f"this job has no parameter-server shards: nothing under "
                        f"{self.keys.ps} after {timeout:.0f}s (start it with elastic-run --num-ps N)")
                raise PSConfigError(f"only shards {sorted(shards)} of {n} published an address "
                                    f"under {self.keys.ps} within {timeout:.0f}s")
            time.sleep(delay)  # polling a key prefix: the store has no cheaper wait here
            delay = min(delay * 2, 0.5)

    def close(self) -> None:
        self.store.close()


def registry_from_env(environ=os.environ) -> StoreRegistry | None:
    """The job's registry when ``ELASTIC_RENDEZVOUS`` and ``ELASTIC_JOB_ID`` are set,
    else None. Raises RendezvousError subclasses when the store cannot be opened."""
    url, job_id = environ.get(env.ENV_RENDEZVOUS), environ.get(env.ENV_JOB_ID)
    if not url or not job_id:
        return None
    from rendezvous import open_store
    return StoreRegistry(open_store(url, environ.get(env.ENV_SECRET)), job_id)


def store_round_hooks(store, job_id: str, worker_id: str
                      ) -> tuple[Callable[[], tuple[int, int, int] | None], Callable[[int], bool]]:
    """``(round_source, newer_round)`` read from the job's published plan: the round
    this worker is a member of (id, size, rank), and whether a round newer than a given
    id has been published."""
    keys = JobKeys(job_id)

    def plan() -> Plan | None:
        kv = store.get(keys.round)
        return Plan.from_json(kv.value) if kv is not None else None

    def round_source():
        p = plan()
        member = p.member(worker_id) if p is not None else None
        return (p.round_id, p.size, member.rank) if member is not None else None

    def newer_round(round_id: int) -> bool:
        p = plan()
        return p is not None and p.round_id > round_id

    return round_source, newer_round
