"""The job's hosts: where they come from (the ``HostDiscovery`` interface in
``discovery``, its sources by name in ``registry``: ``fixed``, ``script``), host lists
and their slots (``slots``, pure), which hosts the job may use now, with the blacklist
(``manager``, pure), and whether a host still answers (``probe``)."""
