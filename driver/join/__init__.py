"""Join mode (``elastic-run --join``): the same command on every node makes that node a
host of the job, with no ssh anywhere.

* ``settings``: what join mode needs and checks before anything starts (the store, the
  job id, the secret, this node's name and slots);
* ``node``: this node's part: the job's secret, the shape every node must agree on,
  and this host's agent, started here.

The driver itself is the usual one, standing by while another node leads; its hosts are
the joined nodes (``driver.hosts.joined``), reached through their agents.
"""
