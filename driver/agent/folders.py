"""Whether a host's agent can start an assignment that keeps snapshots: the job's
``--checkpoint-dir`` (``ELASTIC_CHECKPOINT_DIR`` in the assignment's variables) may be
this host's own, host-local folder, so each host checks it before a worker starts there.

Why before: a worker on a host that cannot write its snapshots would fail every one of
them, long after it started; the agent refuses the start at once instead, as a
permanent launch failure that names the host (the driver checks its own machine's the
same way before anything starts: ``driver.config_checks.snapshot_settings``).
"""

from __future__ import annotations

from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.private_dir import make_private_dir, probe_writable
from rendezvous.schema.agents import Assignment


def checkpoint_dir_problem(host: str, folder: str) -> str | None:
    """Why ``host`` cannot keep snapshots in ``folder`` (the job's ``--checkpoint-dir``,
    which may be this host's own, host-local), or None: made when missing, private,
    and a probe file written and removed there (the driver checks its own machine's
    the same way before anything starts)."""
    try:
        make_private_dir(folder, "--checkpoint-dir")
        probe_writable(folder, "--checkpoint-dir")
    except (RendezvousConfigError, OSError) as exc:
        return f"on host {host}: {exc}"
    return None


class CheckpointFolders:
    """The checkpoint folders the agent of ``host`` found it can write in: each checked
    once, then taken as good for the agent's life."""

    def __init__(self, host: str):
        self._host = host
        self._good: set[str] = set()

    def problem(self, assignment: Assignment) -> str | None:
        """Why this host cannot keep the assignment's snapshots
        (``checkpoint_dir_problem``), or None (it keeps none, or it can)."""
        folder = assignment.env.get(env.ENV_CHECKPOINT_DIR, "")
        if not folder or folder in self._good:
            return None
        problem = checkpoint_dir_problem(self._host, folder)
        if problem is None:
            self._good.add(folder)
        return problem
