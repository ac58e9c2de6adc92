"""A warm spare's side of the round protocol (``elastic.runtime`` with ``ELASTIC_SPARE``):
it registers like any worker, waits in ``join`` past the round timeout while rounds
leave it out, and joins the first round that includes it. A real embedded store."""

from __future__ import annotations

import threading

import pytest

from driver.policy.planner import build_plan
from elastic.runtime import WorkerRuntime, WorkerSettings
from rendezvous import env, open_store
from rendezvous.backends.embedded import EmbeddedServer
from rendezvous.errors import RendezvousConnectionError, RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.net.auth import make_secret
from rendezvous.schema.workers import WorkerInfo
from tests.support.jobs import wait_until
from tests.support.rounds import publish_plan


def test_the_spare_flag_comes_from_the_environment():
    base = {
        env.ENV_RENDEZVOUS: "embedded://127.0.0.1:1",
        env.ENV_JOB_ID: "j",
        env.ENV_WORKER_ID: "w",
        env.ENV_SECRET: "s",
        env.ENV_BIND_HOST: "127.0.0.1",
    }
    assert not WorkerSettings.from_env(base).spare
    assert WorkerSettings.from_env({**base, env.ENV_SPARE: "1"}).spare


@pytest.mark.timeout(60)
def test_an_idle_spare_outwaits_the_round_timeout_and_joins_when_promoted():
    secret = make_secret()
    server = EmbeddedServer(secret)
    server.start()
    url = f"embedded://{server.address}"
    keys = JobKeys("j")

    def runtime(worker_id: str, spare: bool) -> WorkerRuntime:
        settings = WorkerSettings(
            store_url=url,
            job_id="j",
            worker_id=worker_id,
            host="127.0.0.1",
            slot=0,
            secret=secret,
            round_timeout=0.2,
            spare=spare,
        )
        return WorkerRuntime(settings)

    spare, member = runtime("s", True), runtime("m", False)
    store = open_store(url, secret)
    results: dict[str, object] = {}

    def join(rt: WorkerRuntime, key: str) -> None:
        try:
            results[key] = rt.join(after_round=0)
        except RendezvousError as exc:  # the test reads what join() raised
            results[key] = exc

    try:
        spare.start()
        member.start()
        waiting = threading.Thread(target=join, args=(spare, "s"), daemon=True)
        waiting.start()
        threading.Thread(target=join, args=(member, "m"), daemon=True).start()
        # A round that leaves both out: the worker gives up after its round timeout...
        other = WorkerInfo("x", "127.0.0.1", 0, 1, "127.0.0.1:1")
        publish_plan(store, keys, build_plan(1, [other]))
        wait_until(lambda: "m" in results, 10, "the worker's round timeout")
        assert isinstance(results["m"], RendezvousConnectionError)
        # ... the spare, which waited as long, still waits.
        assert waiting.is_alive() and "s" not in results and spare.plan is None
        # Promoted: the driver publishes a round with its registration.
        kv = store.get(keys.worker("s"))
        assert kv is not None
        publish_plan(
            store, keys, build_plan(2, [WorkerInfo.from_json(kv.value)]), build_plan(1, [other])
        )
        waiting.join(10)
        plan = results["s"]
        assert not isinstance(plan, RendezvousError), plan
        assert spare.round_id == 2 and spare.member is not None and spare.member.rank == 0
    finally:
        spare.shutdown()
        member.shutdown()
        store.close()
        server.stop()
