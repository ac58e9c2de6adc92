"""The driver's side of the per-host agents (``driver.agent``): what the job's loop asks
of them (``service``: ``AgentService``, and ``NoAgents`` for a job that runs none), the
launcher that starts them and hands them processes through the store (``launcher``),
its hold on one agent (``handle``), on one process an agent runs (``assigned``), and a
predecessor's agents read back from the store (``snapshot``)."""
