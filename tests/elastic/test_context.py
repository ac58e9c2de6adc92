"""Pure-logic tests of the worker's context seams: a State over an injected world, and
the worker settings read from an elastic-run environment."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import elastic
from elastic import context
from elastic.errors import HostsUpdatedInterrupt
from elastic.runtime import WorkerSettings
from elastic.state import NumpyState, ObjectState
from rendezvous import env
from rendezvous.errors import RendezvousConfigError, RendezvousError

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


class ScriptedWorld:
    """A world of ``size`` workers seen from one of them: collectives answer with what
    the test scripted for the other workers (no I/O)."""

    def __init__(
        self,
        size: int,
        counts: list[int] | None = None,
        root_values=None,
        root_arrays: dict | None = None,
        pending: int | None = None,
    ):
        self._size = size
        self.counts = counts or [0] * size
        self.root_values = root_values
        self.root_arrays = root_arrays or {}
        self.pending = pending
        self.roots: list[int] = []

    def size(self) -> int:
        return self._size

    def allgather_object(self, obj):
        return list(self.counts)

    def broadcast_object(self, obj=None, root=0):
        self.roots.append(root)
        return self.root_values

    def broadcast(self, x, root=0):
        return self.root_arrays.get(x.shape, x)

    def pending_round(self):
        return self.pending


def test_sync_adopts_the_state_and_commit_count_of_the_worker_with_most_commits():
    world = ScriptedWorld(3, counts=[2, 5, 5], root_values={"epoch": 9, "loss": 0.5})
    state = ObjectState(world, epoch=1, loss=1.0)
    state.sync()
    assert world.roots == [1]
    assert (state.epoch, state.loss) == (9, 0.5)
    state.epoch = 10
    state.restore()  # the sync saved what it adopted
    assert state.epoch == 9 and state._commits == 5


def test_numpy_state_sync_receives_arrays_of_the_root_shape():
    world = ScriptedWorld(
        2,
        counts=[0, 1],
        root_values=({"w": ((3,), np.dtype("float64").str)}, {"step": 4}),
        root_arrays={(3,): np.arange(3.0)},
    )
    state = NumpyState(world, step=0)  # a new worker: no "w" yet
    state.sync()
    assert list(state.w) == [0.0, 1.0, 2.0] and state.step == 4


def test_commit_raises_hosts_updated_when_the_world_has_a_newer_round():
    state = ObjectState(ScriptedWorld(1, pending=7), epoch=0)
    state.epoch = 1
    with pytest.raises(HostsUpdatedInterrupt, match="round 7 is pending"):
        state.commit()
    state.epoch = 2
    state.restore()
    assert state.epoch == 1  # committed before the interrupt


def test_the_world_is_positional_only_so_every_keyword_stays_an_attribute():
    state = ObjectState(world="user value", epoch=0)
    assert state.world == "user value"
    assert state._world is None  # the default world: elastic.context


def test_a_state_with_the_default_world_copies():
    state = ObjectState(epoch=3)
    assert copy.deepcopy(state).epoch == 3


def test_the_context_is_the_default_world_and_a_static_world_never_has_a_pending_round():
    elastic.init()  # a world of one
    state = ObjectState(epoch=0)
    assert state._world_in_use() is context
    assert context.current_runtime() is None and context.pending_round() is None
    state.commit()
    state.sync()
    assert (elastic.rank(), elastic.size(), elastic.local_size(), elastic.cross_size()) == (
        0,
        1,
        1,
        1,
    )


ELASTIC_RUN_ENV = {
    env.ENV_RENDEZVOUS: "embedded://127.0.0.1:1",
    env.ENV_JOB_ID: "job",
    env.ENV_WORKER_ID: "w0",
    env.ENV_SECRET: "s",
    env.ENV_SLOT: "2",
    env.ENV_PEER_TIMEOUT: "3",
}


def test_worker_settings_from_an_elastic_run_environment():
    settings = WorkerSettings.from_env(ELASTIC_RUN_ENV)
    assert (settings.job_id, settings.worker_id, settings.slot) == ("job", "w0", 2)
    assert settings.comm.peer_timeout == 3.0 and settings.round_timeout == 600.0
    assert settings.bind_host == "127.0.0.1"


@pytest.mark.parametrize(
    "name,value",
    [
        (env.ENV_SECRET, None),
        (env.ENV_WORKER_ID, ""),
        (env.ENV_SLOT, "one"),
        (env.ENV_ROUND_TIMEOUT, "0"),
        (env.ENV_LEASE_TTL, "0"),
        (env.ENV_CONNECT_TIMEOUT, "x"),
    ],
)
def test_worker_settings_name_the_missing_or_malformed_variable(name, value):
    environ = {k: v for k, v in ELASTIC_RUN_ENV.items() if k != name}
    if value is not None:
        environ[name] = value
    with pytest.raises(RendezvousConfigError, match=name) as caught:
        WorkerSettings.from_env(environ)
    assert isinstance(caught.value, RendezvousError)  # what init()'s callers catch


class _RuntimeStandIn:
    """What ``State.commit`` reaches of a worker runtime through ``elastic.context``."""

    committed = 0
    commit_round = 0
    round_id = 3

    def pending_round(self):
        return None


def test_a_commit_tells_the_runtime_its_count_and_nothing_else(monkeypatch):
    runtime = _RuntimeStandIn()
    monkeypatch.setattr(context, "_runtime", runtime)
    state = ObjectState(epoch=0)
    for _ in range(3):
        state.commit()
    assert runtime.committed == 3 and runtime.commit_round == 3  # (made in round 3)
    injected = ObjectState(ScriptedWorld(1), epoch=0)  # a world of its own: not the runtime's
    injected.commit()
    assert runtime.committed == 3


def test_worker_settings_read_the_progress_interval():
    assert WorkerSettings.from_env(ELASTIC_RUN_ENV).progress_interval == 0.0
    environ = {**ELASTIC_RUN_ENV, env.ENV_PROGRESS_INTERVAL: "2.5"}
    assert WorkerSettings.from_env(environ).progress_interval == 2.5
    with pytest.raises(RendezvousConfigError, match=env.ENV_PROGRESS_INTERVAL):
        WorkerSettings.from_env({**ELASTIC_RUN_ENV, env.ENV_PROGRESS_INTERVAL: "soon"})


class Stateful:
    """An object a loop keeps, with a state dict (as a torch module or optimizer)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_object_state_warns_of_objects_it_would_replace_behind_the_loop():
    with pytest.warns(elastic.ReplacedStateWarning) as caught:
        state = ObjectState(ScriptedWorld(1), epoch=0, model=Stateful())
    (warning,) = caught
    text = str(warning.message)
    assert "'model'" in text and "Stateful" in text and "TorchState(model=...)" in text
    assert warning.filename == __file__  # points at the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state.commit()  # once per attribute
        state.history = [1, 2]  # plain values: copies are harmless
        state.w = np.zeros(3)
        state.commit()
    state.optimizer = Stateful()  # assigned later: seen at the next commit
    with pytest.warns(elastic.ReplacedStateWarning, match="'optimizer'"):
        state.commit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NumpyState(ScriptedWorld(1), w=np.zeros(2), epoch=0, names=["a"])
