"""Real communicator workers: the process (``worker.py``), the collectives it runs and
checks (``battery.py``, against ``oracle.py``), and the pool that spawns them
(``workers.py``)."""
