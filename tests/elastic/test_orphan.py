"""The rule by which a worker or shard sees that elastic-run is gone (pure)."""

from __future__ import annotations

import pytest

from elastic.orphan import parent_is_gone

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def test_parent_is_gone():
    assert not parent_is_gone(100, 100)
    assert parent_is_gone(100, 1)
    assert parent_is_gone(100, 57)  # a subreaper adopted us
    assert not parent_is_gone(1, 1)  # started by init itself: nothing to watch
