"""The benchmarks: each script prints one JSON line per measured configuration, next to
a peer system. Run them from the repository root as modules, ``python -m
benchmarks.NAME`` (``sudo`` for the ones on test hosts), so that they, their harness
(``benchmarks.harness``), the product and the test rigs (``tests.support``) import by
name, with no path edits. ``docs/BENCHMARKS.md`` lists them with their figures."""
