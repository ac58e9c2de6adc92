"""``elastic-run``, the driver: its entry point and flags at this root (``cli``, ``flags``,
``config``, ``errors``, ``threads``, ``watch``), the rest one subpackage per concern:
``job/`` (the main loop and its parts), ``lead/`` (who leads a job), ``policy/`` (every
rule, pure), ``hosts/`` (where hosts come from, and which the job may use),
``launch/`` (how a host's processes start, the agents' driver side included),
``agent/`` (the per-host agent program), ``events/`` (what the driver says), ``ps/``
(the parameter-server shards under the driver). ``docs/DESIGN.md`` has the table of
what each may import."""
