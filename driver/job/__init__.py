"""One job, run by one driver: the main loop (``loop``) and its parts, which share one
context (``context``, ``state``): the lead's writes (``lead``), the workers' starts,
stops and kills (``actions``), the messages from the job's threads (``messages``,
``feeds``) and what they mean (``handlers``), what runs beside the workers
(``services``, ``chaos``), how the job is wired to its processes and store (``wiring``),
the worker processes (``processes``), and what a job is made of when its caller gives
nothing (``defaults``). The rules the loop asks are ``driver.policy``'s."""
