"""The benchmarks: each script prints one JSON line per measured configuration, next to
a peer system. Run them from the repository root as modules, ``python -m
benchmarks.NAME`` (``sudo`` for the ones on test hosts), so that they, their harness
(``benchmarks.harness``, which holds the test rigs they share with the tests: the test
hosts, the etcd, Slurm and Ray clusters, the job runner) and the product import by name,
with no path edits; no benchmark imports ``tests``. ``docs/BENCHMARKS.md`` lists them with their figures."""
