"""What the benchmarks share: where things are, waits with deadlines, the jobs they
measure, the workers' commit logs, the statistics of the samples, the test hosts. One
module per concern; each benchmark script keeps only its own measurement.

The benchmarks run from the repository root as modules (``python -m benchmarks.NAME``),
so this package, the product and the test rigs (``tests.support``) import by their names.
"""
