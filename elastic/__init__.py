"""The worker API: ``import elastic`` (contract in docs/DESIGN.md).

This module only names the API: each part lives in its own module, and each module's
``__all__`` says what of it is public, so the face below repeats no name by hand:

- ``elastic.context``: ``init()``/``shutdown()``, the layout (``rank()``, ``size()``, ...)
  and the collectives, over the world the process was started in (``elastic-run``,
  ``mpiexec``, or alone);
- ``elastic.state``: ``State``, ``ObjectState``, ``NumpyState``;
- ``elastic.loop``: ``@run``;
- ``elastic.sampler``: ``ElasticSampler``;
- ``elastic.average``: ``weighted_average``, the workers' means combined by sample count;
- ``elastic.errors``: every exception a training script may catch;
- ``elastic.ps``: ``elastic.ps.connect()``, the parameter-server client: the ``ps``
  package under its worker-API name (``elastic/ps.py``), imported on first use;
- ``__version__``: the project's version (``rendezvous.version``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastic import average, context, errors, loop, sampler, state
from elastic.average import *  # noqa: F403  (the face: each module's __all__)
from elastic.context import *  # noqa: F403
from elastic.errors import *  # noqa: F403
from elastic.loop import *  # noqa: F403
from elastic.sampler import *  # noqa: F403
from elastic.state import *  # noqa: F403

if TYPE_CHECKING:  # at run time ``__getattr__`` imports it, on first use
    from elastic import ps


def __getattr__(name: str) -> Any:
    # ``ps`` is imported when asked for: the ``ps`` package imports this one's errors
    # and sockets, so importing it here, at the top, would make a circle.
    if name == "ps":
        import importlib

        return importlib.import_module("elastic.ps")
    # ``__version__`` is read when asked for (pyproject.toml or the package metadata,
    # ``rendezvous.version``), so that ``import elastic`` reads no file.
    if name == "__version__":
        from rendezvous.version import package_version

        return package_version()
    raise AttributeError(f"module 'elastic' has no attribute {name!r}")


__all__ = ["ps"]
__all__ += context.__all__
__all__ += average.__all__
__all__ += state.__all__
__all__ += loop.__all__
__all__ += sampler.__all__
__all__ += errors.__all__
