"""The command line that starts one shard: ``python -m elastic.ps.server --index I ...``
(the driver's ``shard_command``). The shard itself is ``elastic.ps.shard.server``."""

from __future__ import annotations

import sys

from elastic.ps.shard.server import main

if __name__ == "__main__":
    sys.exit(main())
