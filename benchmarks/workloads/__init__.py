"""The programs the benchmarks run as workers (by path, with the repository root on
their ``PYTHONPATH``, as the test rigs start every worker)."""
