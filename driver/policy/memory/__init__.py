"""What the job's rules remember between decisions, one record per concern.

Each module holds one concern's record, with the few changes other parts ask of it,
and names the rule module that keeps it: ``rounds`` (``driver.policy.rounds``),
``failures`` (``driver.policy.exits``, ``driver.policy.suspicion``), ``progress``
(``driver.policy.reports``), ``spares`` (``driver.policy.spares``), ``hosts``
(``driver.policy.reports``, ``driver.policy.preemption``, ``driver.policy.departures``)
and ``worlds`` (``driver.policy.restarts``). The ``Book`` that holds one of each is
``driver.policy.decisions.Book``. Plain values: none of them imports a rule.
"""
