"""The decisions of a sharded state's sync, as pure functions of what the members hold.

A *layout* is one cut of the sharded state: the round group it was cut for and its
size; each of its ranks holds one part. A member reports (``Holding``) the layout of
its own part, the commits of it that it keeps (the last two), and the commits of other
parts it keeps as their mirror. The sync then picks (``choose``) the newest commit
whose every part is held somewhere, and who sends each part (the part's owner when it
is still there, else its mirror).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Holding:
    """What one member of the new round holds of the sharded state.

    layout: the key of the layout of its own part (None: it holds none, a newcomer);
    size: that layout's size; rank: its rank in it;
    own: the commits of its own part it keeps;
    mirrored: (layout, rank, commit) of the parts it keeps for others."""

    layout: str | None
    size: int = 0
    rank: int = -1
    own: tuple[int, ...] = ()
    mirrored: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class Choice:
    """The commit the members adopt: ``commit`` of ``layout`` (``size`` parts), part
    ``r`` sent by new rank ``senders[r]``; ``root``: the new rank that sends the
    replicated rest; ``in_place``: every part is where it already is (same layout, each
    owner at its own rank) and nothing needs to travel."""

    layout: str
    size: int
    commit: int
    senders: tuple[int, ...]
    root: int
    in_place: bool = False


@dataclass(frozen=True)
class Lost:
    """No commit has every part held: ``newest`` is the newest commit any member holds."""

    newest: int
    missing: tuple[int, ...] = field(default=())


def choose(holdings: list[Holding], current_layout: str | None) -> Choice | Lost:
    """The commit to adopt (newest first, the layout with the most commits first), or
    ``Lost`` (pure). ``current_layout``: the layout of the new round's own mesh, to tell
    whether everything is already in place."""
    candidates: dict[tuple[str, int], dict[int, list[int]]] = {}
    sizes: dict[str, int] = {}
    newest = -1
    for member, h in enumerate(holdings):
        if h.layout is None:
            continue
        sizes[h.layout] = h.size
        for commit in h.own:
            newest = max(newest, commit)
            candidates.setdefault((h.layout, commit), {}).setdefault(h.rank, []).insert(0, member)
    for member, h in enumerate(holdings):
        for layout, rank, commit in h.mirrored:
            if (layout, commit) in candidates:
                candidates[(layout, commit)].setdefault(rank, []).append(member)
    missing: tuple[int, ...] = ()
    for layout, commit in sorted(candidates, key=lambda k: (k[1], k[0]), reverse=True):
        held = candidates[(layout, commit)]
        size = sizes[layout]
        lacking = tuple(r for r in range(size) if r not in held)
        if lacking:
            missing = missing or lacking
            continue
        senders = tuple(held[r][0] for r in range(size))
        owners = [m for m, h in enumerate(holdings) if h.layout == layout and commit in h.own]
        in_place = (
            layout == current_layout
            and size == len(holdings)
            and all(holdings[m].rank == m and commit in holdings[m].own for m in range(size))
        )
        return Choice(layout, size, commit, senders, min(owners), in_place)
    return Lost(newest, missing)


def mirror_holder(rank: int, hosts: list[str]) -> int | None:
    """The rank that keeps ``rank``'s mirror (pure): the next rank on another host, or
    on a one-host job the next rank; None alone."""
    size = len(hosts)
    if size < 2:
        return None
    for step in range(1, size):
        other = (rank + step) % size
        if hosts[other] != hosts[rank]:
            return other
    return (rank + 1) % size
