"""``elastic-run``: parse the command line, run the job, exit with its status.

Exit status: 0 when every worker of the final round exited 0 (and for a joined node
that left on SIGTERM: its host drained, the job goes on); 1 with a one-line reason
when the job failed (reset limit, elastic timeout, every host blacklisted, a worker of the
final round failed, a discovery or store error, the committed state lost, or training
finished but the ps shards' final checkpoint could not be written); 3 when another
driver took the job over (this one steers nothing more; the job goes on under the new
leader); 128 + N when signal N stopped it (143 for SIGTERM, 130 for SIGINT), after its
final snapshot with ``--checkpoint-dir``: a stopped job is resumable, not failed; 0 for
a ``--standby`` whose job ended under its leader; 2 for bad arguments (and a
``--log-dir`` that cannot be made, an ``--events`` file that cannot be opened, an etcd
that speaks TLS where the URL does not or the reverse, a ``--join`` node whose job has
ended, without ``--new-job``).
``--version`` prints the version and exits 0.
"""

from __future__ import annotations

import logging
import os
import sys

from driver.checkpoint_folder import claim_checkpoint_dirs
from driver.config import parse_args, unshared_secret_note
from driver.errors import (
    DriverError,
    JobEnded,
    JobLeft,
    JobStopped,
    LeadershipLost,
    UsageError,
)
from driver.etcd_security import check_transport
from driver.events.log import line_prefix
from driver.job.loop import Job
from driver.join.node import JoinedNode
from rendezvous.checkpoint_claim import FolderClaim
from rendezvous.errors import ElasticError, StoreLoginRefused
from rendezvous.process_exit import run_then_exit
from rendezvous.resources import raise_fd_limit

PROG = "elastic-run"


def _say(text: str) -> None:
    """One line of the driver's own on stderr, timestamped like its event lines."""
    print(f"{line_prefix(PROG, timestamps=True)}{text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``elastic-run`` with ``argv``: its exit status. ``argv`` None (the installed
    command): this process's own arguments, and the process ends with the status once the
    job is over, with no interpreter finalization to hang in
    (``rendezvous.process_exit``)."""
    if argv is None:
        run_then_exit(lambda: _run(sys.argv[1:]))
    return _run(argv)


def _run(argv: list[str]) -> int:
    folders: list[FolderClaim] = []
    try:
        config = parse_args(argv)
        # The --etcd-* flags, for this driver's own clients and every process it starts
        # (each inherits this environment), as ELASTIC_ETCD_* (driver.etcd_security).
        os.environ.update(config.etcd_env)
        node = JoinedNode(config, config.join) if config.join is not None else None
        if node is not None and config.join is not None and config.join.spare_task:
            _say(f"--join: another task of node {config.join.host}, whose first task joins")
            return 0
        check_transport(config.rendezvous)
        if node is not None:
            node.prepare()  # before the job: its secret, and the shape it must agree on
        # One job per --checkpoint-dir, held for this driver's life; last, so that a
        # start refused for another reason leaves the folder's owner as it was (a
        # joined node's job id is given: the node built above runs as the same one).
        config, folders, owner_notes = claim_checkpoint_dirs(config)
        for owner_note in owner_notes:
            _say(owner_note)
        job = Job(config, leave=node.leave if node is not None else None)
        if (note := unshared_secret_note(config)) is not None:
            _say(note)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        for folder in folders:
            folder.close()
        return 2
    logging.basicConfig(
        level=logging.DEBUG
        if config.verbosity > 1
        else logging.INFO
        if config.verbosity
        else logging.WARNING,
        format=f"{PROG} [%(asctime)s]: %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    # The store's connections are capped to a share of the limit, the rest kept for
    # the job (workers' pipes, logs): raised first, so both shares are as large as
    # the system allows (rendezvous.resources).
    raise_fd_limit()
    try:
        if node is not None:
            node.start_agent()
        return job.run()
    except LeadershipLost as exc:
        _say(str(exc))
        return 3
    except JobEnded as exc:
        _say(str(exc))
        return 0
    except JobLeft as exc:
        _say(str(exc))
        return 0
    except JobStopped as exc:
        _say(str(exc))
        return 128 + exc.signum
    except UsageError as exc:  # a joined node that disagrees with the job it found
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except StoreLoginRefused as exc:  # as a missing password is (driver.etcd_security)
        print(f"{PROG}: error: --etcd-user: {exc}", file=sys.stderr)
        return 2
    except (DriverError, ElasticError) as exc:
        _say(f"job failed: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted; all workers were stopped")
        return 130
    finally:
        if node is not None:
            node.close()
        for folder in folders:
            folder.close()


if __name__ == "__main__":
    main()
