"""The per-host agent: runs what the job's leader assigns to its host, and reports.

``python -m driver.agent --job-id ID --host LABEL`` (the store's URL and the job's
secret come from the environment, as the workers get them). The modules:

* ``rules``: what to do about the host's processes (a pure function of the
  assignments, the process table, the terms and the time);
* ``table``: the agent's process table;
* ``output``: where forwarded output goes (stdout and the per-host log file);
* ``loop``: the agent itself (``Agent``): the store, the processes, the reports;
* ``__main__``: the command line.

The driver's side (starting agents, writing assignments, following their reports) is
``driver.launch.assignments.launcher``.
"""
