"""No part of the driver's job, agent, lead, launchers, hosts or ps shards takes more than 7
collaborators: a constructor says what a part touches (read from the source, by ``ast``;
records and settings, dataclasses of values, are not parts)."""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import ROOT

MOST_COLLABORATORS = 7
PACKAGES = ("job", "agent", "leadership", "launch", "hosts", "ps")


def constructors() -> list[tuple[str, int]]:
    """Each ``__init__`` of a class in ``PACKAGES``, as (where, its parameters but self)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / "driver" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        a = item.args
                        count = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
                        where = f"{path.relative_to(ROOT)}:{node.name}"
                        found.append((where, count))
    return found


@pytest.mark.timeout(30)
def test_no_part_takes_more_than_seven_collaborators():
    found = constructors()
    assert any(where.endswith(":Job") for where, _ in found)  # (the scan reads the tree)
    wide = [f"{where} takes {count}" for where, count in found if count > MOST_COLLABORATORS]
    assert not wide
