"""The pure decisions about a checkpoint folder's snapshots: the structure a snapshot is
tagged with and what differs from a state's, whose each snapshot is, which a prune
deletes, and which a full disk deletes first (never the newest complete one, never
another job's)."""

from __future__ import annotations

import numpy as np
import pytest

from elastic.sampler import PROGRESS_ATTR
from elastic.snapshots import keeping
from elastic.snapshots.keeping import LEGACY, MINE, OTHER_JOB, OTHER_STATE, Found, Snapshot
from elastic.snapshots.structure import (
    LIBRARY_PREFIX,
    MAX_NODES,
    Structure,
    describe,
    differences,
    summary,
)

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def numpy_state(n: int, **extra) -> dict:
    return {"w": np.zeros(n), "epoch": 0, **extra}


def test_the_structure_names_the_attributes_and_every_array_with_its_path():
    values = {
        "w": np.zeros((3, 4), dtype=np.float32),
        "opt": ("state_dict", {"state": {0: {"m": np.ones(2)}}, "lr": 0.1}),
        "epoch": 5,
    }
    structure = describe(values)
    assert structure.names == ("epoch", "opt", "w")
    assert [(a.path, a.dtype, a.shape) for a in structure.arrays] == [
        ("opt[1]['state'][0]['m']", "float64", (2,)),
        ("w", "float32", (3, 4)),
    ]
    assert Structure.from_json(structure.to_json()) == structure
    assert describe(values).digest == structure.digest != describe(numpy_state(3)).digest


def test_a_snapshot_of_another_size_or_attribute_does_not_fit():
    """The issue's case: a script of 50,000 elements given a snapshot of 100,000."""
    found = differences(describe(numpy_state(100_000)), describe(numpy_state(50_000)))
    assert found == ["w is ndarray float64 [100000] in it, ndarray float64 [50000] in this state"]
    foreign = differences(describe({"model": np.zeros(2)}), describe(numpy_state(2)))
    assert foreign == ["it holds 'model', which this state does not"]
    assert summary(["a", "b", "c", "d"]) == "a; b (and 2 more)"


def test_what_a_state_gains_as_it_trains_is_no_difference():
    """An optimizer's moments appear at its first step, a history grows, a counter
    counts, and an attribute the script added keeps its own value."""
    start = {"w": np.zeros(4), "opt": {"state": {}}, "history": [], "epoch": 0, "new": 1}
    trained = {"w": np.ones(4), "opt": {"state": {0: {"m": np.ones(4)}}}, "history": [0.5]}
    trained[PROGRESS_ATTR] = {"offsets": {}}  # the sampler's, added at its first step
    assert PROGRESS_ATTR.startswith(LIBRARY_PREFIX)
    assert differences(describe({**trained, "epoch": 9}), describe(start)) == []
    assert differences(describe({"w": np.zeros(4, dtype=np.int64)}), describe(start)) == [
        "w is ndarray int64 [4] in it, ndarray float64 [4] in this state"
    ]


def test_describing_a_huge_list_stops_at_its_budget():
    structure = describe({"xs": list(range(MAX_NODES * 2)), "w": np.zeros(1)})
    assert structure.names == ("w", "xs") and len(structure.arrays) == 1


@pytest.mark.parametrize(
    "raw",
    [[], {"names": "w", "arrays": []}, {"names": [], "arrays": [["w", "ndarray", "f8", [-1]]]}],
)
def test_a_structure_no_writer_writes_is_refused(raw):
    with pytest.raises(ValueError):
        Structure.from_json(raw)


def test_whose_a_snapshot_is():
    ours = describe(numpy_state(10))
    assert keeping.whose("a", ours, "a", ours) == MINE
    assert keeping.whose("a", describe(numpy_state(20)), "a", ours) == OTHER_STATE
    assert keeping.whose("b", ours, "a", ours) == OTHER_JOB
    assert keeping.whose("b", None, "a", ours) == LEGACY
    assert keeping.loadable("a", ours, "a") and keeping.loadable("b", None, "a")
    assert not keeping.loadable("b", ours, "a")  # another job's: never offered


def test_a_torn_folder_says_whose_it_is_by_its_name():
    tag = keeping.job_tag("a")
    assert keeping.whose_folder(f"/d/snap-000000000007-ab12-{tag}", "a") == MINE
    assert keeping.whose_folder(f"/d/snap-000000000007-ab12-{tag}", "b") == OTHER_JOB
    assert keeping.whose_folder("/d/snap-000000000007-ab12", "a") == LEGACY


def snap(step: int, whose: str = MINE) -> Snapshot:
    return Snapshot(f"{whose}-{step}", step, float(step), whose)


def test_a_prune_keeps_the_newest_of_its_own_and_never_anothers():
    found = Found(
        complete=(
            snap(10),
            snap(20),
            snap(30),
            snap(40),
            snap(5, OTHER_JOB),
            snap(90, OTHER_STATE),
            snap(1, LEGACY),
            snap(35, LEGACY),
        ),
        torn=(snap(3), snap(50), snap(4, OTHER_JOB), snap(6, LEGACY)),
    )
    gone = keeping.to_prune(found, keep=3, written=40)
    # ours beyond 3; a legacy one below the oldest kept (20), not the one at 35; our own
    # and legacy torn folders of earlier commits, not the one at 50 (being written)
    assert sorted(gone) == sorted(["mine-10", "legacy-1", "mine-3", "legacy-6"])
    assert keeping.to_prune(Found((snap(1, LEGACY),), ()), keep=3, written=9) == []


def test_a_full_disk_frees_the_oldest_first_and_never_the_newest_complete():
    found = Found(
        complete=(snap(10), snap(20), snap(30), snap(5, OTHER_JOB), snap(2, LEGACY)),
        torn=(snap(25), snap(31), snap(1, OTHER_JOB)),
    )
    assert keeping.room(found, step=31) == ["mine-25", "legacy-2", "mine-10", "mine-20"]
    only = Found(complete=(snap(30),), torn=())
    assert keeping.room(only, step=40) == []  # the one that stands is never deleted
    legacy = Found(complete=(snap(3, LEGACY), snap(8, LEGACY)), torn=())
    assert keeping.room(legacy, step=9) == ["legacy-3"]
