"""``elastic-plot`` / ``python -m runplot``: forwards to ``driver.plot``'s command.

Placeholder until the driver restructuring moves the plot tool here and replaces this file.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from driver import plot


def main(argv: Sequence[str] | None = None) -> int:
    """Run the plot command with ``argv`` (default: the process's arguments)."""
    return plot.main(argv)


if __name__ == "__main__":
    sys.exit(main())
