"""No part of the product (``driver``, ``elastic``, ``ps``, ``rendezvous``) takes more than 7
collaborators: a constructor says what a part touches (read from the source, by ``ast``;
records and settings, dataclasses of values, are not parts). ``STILL_WIDE`` names the
parts not yet cut down; the list only shrinks (a part on it that is no longer wide fails
the test until it is taken off)."""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import ROOT

MOST_COLLABORATORS = 7
PACKAGES = ("driver", "elastic", "ps", "rendezvous")
STILL_WIDE = frozenset(
    {
        "elastic/torch/reducer.py:GradientReducer",
    }
)


def constructors() -> list[tuple[str, int]]:
    """Each ``__init__`` of a class in ``PACKAGES``, as (where, its parameters but self)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
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
    wide = {where: count for where, count in found if count > MOST_COLLABORATORS}
    assert not [
        f"{where} takes {count}" for where, count in wide.items() if where not in STILL_WIDE
    ]
    assert not [f"{where} is no longer wide" for where in STILL_WIDE if where not in wide]
