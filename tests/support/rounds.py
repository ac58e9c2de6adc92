"""Publishing a round as the driver does, for tests and benchmarks that stand in for
the driver: ``rendezvous.host_plan.plan_ops`` written with plain transactions (the
driver's are fenced on its lead; a stand-in leads nothing)."""

from __future__ import annotations

from rendezvous.host_plan import plan_ops
from rendezvous.keys import JobKeys
from rendezvous.schema.rounds import Plan
from rendezvous.store import KVStore


def publish_plan(store: KVStore, keys: JobKeys, plan: Plan, previous: Plan | None = None) -> int:
    """Write ``plan`` as the job's round (the whole plan, its head and each host's
    part; the parts of ``previous``'s hosts it left out deleted); the revision of the
    publishing write.

    Raises:
        RendezvousError: the store cannot be used."""
    writes = plan_ops(keys, plan, previous)
    for batch in writes.before:
        store.txn([], list(batch))
    revision = store.txn([], list(writes.publish)).revision
    for batch in writes.after:
        store.txn([], list(batch))
    return revision
