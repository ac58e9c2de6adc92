"""What the benchmarks share: where things are, waits with deadlines, the jobs they
measure, the workers' commit logs, the statistics of the samples, the test hosts. One
module per concern; each benchmark script keeps only its own measurement.

The rigs the tests run on too live here, so that no benchmark imports ``tests``: the
test hosts (``netns.py``, PID 1 of each ``netns_init.py``), the etcd, Slurm and Ray
clusters on them (``etcd_cluster.py``, ``slurm.py``, ``ray_cluster.py``), the job runner
(``jobs.py``: ``ElasticRun``, waits with deadlines) and real communicator workers
(``comm/``). ``tests.support`` names them where the tests import them.

The benchmarks run from the repository root as modules (``python -m benchmarks.NAME``),
so this package and the product import by their names.
"""
