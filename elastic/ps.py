"""``elastic.ps``: the parameter server's client under the name the worker API gives it
(docs/DESIGN.md, "Parameter servers").

The parameter server is its own package, ``ps`` (client, shards, and what both speak);
this module is only its name on ``elastic``. Every name is ``ps``'s own object, read when
asked for, so ``except elastic.ps.PSError`` and ``except ps.PSError`` catch the same
class, and ``import elastic`` does not import ``ps`` until a script uses it (``ps``
imports ``elastic``'s errors and sockets: the worker runtime sits below it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ps as _ps

if TYPE_CHECKING:  # the names as ``ps`` types them; at run time ``__getattr__`` reads them
    from ps import *  # noqa: F403

__all__ = list(_ps.__all__)


def __getattr__(name: str) -> object:
    # PEP 562: every public name of ``ps`` (its lazy ``PSClient``/``ClientSettings`` too).
    return getattr(_ps, name)


def __dir__() -> list[str]:
    return __all__
