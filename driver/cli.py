"""``elastic-run``: parse the command line, run the job, exit with its status.

Exit status: 0 when every worker of the final round exited 0; 1 with a one-line reason
when the job failed (reset limit, elastic timeout, every host blacklisted, a worker of the
final round failed, a discovery or store error); 2 for bad arguments.
"""

from __future__ import annotations

import logging
import sys

from driver.config import parse_args
from driver.errors import DriverError, UsageError
from driver.job import Job
from rendezvous.errors import ElasticError

PROG = "elastic-run"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG
        if config.verbosity > 1
        else logging.INFO
        if config.verbosity
        else logging.WARNING,
        format=f"{PROG}: %(levelname)s %(name)s: %(message)s",
    )
    try:
        return Job(config).run()
    except (DriverError, ElasticError) as exc:
        print(f"{PROG}: job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; all workers were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
