"""Who leads a job: terms and fences as pure rules (``terms``), the claim a driver holds
on its job in the store (``claim``), the state a leader persists and a successor's view
rebuilt from it (``persisted``, pure), and the workers a successor knows by pid alone
(``adopted_pids``)."""
