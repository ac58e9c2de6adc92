"""The small programs the job runs on a host around one of its processes, each a
``python -m driver.programs.NAME``; none of them is a launcher (``driver.launch``) nor
launches anything for the driver:

* ``world_entry``: what a worker of a world of restart mode (``--restart-workers``)
  runs first: it meets rank 0 through the store, then becomes the job's command with
  ``MASTER_ADDR``/``MASTER_PORT`` set;
* ``world_spare``: a warm spare of restart mode (``--spares``), which imports what the
  program imports and waits for a seat;
* ``ray_step``: the ``ray`` launcher's local side: one process on one node of a Ray
  cluster, run from here as if it ran here (as ``ssh`` is the ``ssh`` launcher's);

and what they share with the driver's checks: ``python_command`` (what a command line
runs when it is a Python program, and what that program imports at its top; the
driver refuses ``--spares`` for a command that is none).
"""
