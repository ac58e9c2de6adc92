"""Hung workers (``--hang-timeout``): a worker whose process lives but whose training does
not reach its next collective in time tells the driver so, with every thread's stack.

``clock.py`` is what every collective and commit ticks (cheap, pure rules beside it);
``watchdog.py`` the thread that reads it, and the stacks and the report it sends
(``elastic.worker_reports``' store, under the registration's lease). It also makes
SIGUSR1 print every thread's stack on the worker's stderr (``elastic-run`` forwards a
SIGUSR1 of its own to its workers so). Nothing here is imported by ``import elastic``
but the clock, which imports nothing of the project but ``rendezvous.env``.
"""
