"""How a host's processes start (workers, ps shards, the per-host agents): the
``Launcher`` interface, one module per way of starting them, chosen by name.

The package is in layers, each module using only the ones above it:

* ``spec``: what to start (``LaunchSpec``) and how to run ssh (``SSHSettings``);
  validated frozen values, no I/O;
* ``ssh_wrapper``: the POSIX-sh wrapper an ssh worker runs under and the ssh command
  line (pure functions);
* ``output``: forwarding of a process's output, line by line and prefixed;
* ``process``: a started process's life: exit, signals to its process group, stop with
  a grace period (``WorkerProcess``, ``SSHWorkerProcess``, ``stop_all``, ``STOP_GRACE``);
* ``base``: the ``Launcher`` interface, ``launch(spec)``, the one launch signature for
  workers, shards and agents;
* ``local``, ``ssh``, ``auto``: the launchers, one module each;
* ``registry``: the launchers by name (``LAUNCHERS``, ``get_launcher``), which
  ``--launcher`` offers: a new launcher is a module here and a name there;
* ``agents/``: the driver's side of the per-host agents, behind the same interface
  (``AgentLauncher``), and what the job's loop asks of them (``AgentService``);
* ``world_entry``: not a launcher but what a launched worker of a world of restart mode
  (``--restart-workers``) runs first, on its host: it meets rank 0 through the store,
  then becomes the job's command with ``MASTER_ADDR``/``MASTER_PORT`` set.

Errors are in ``driver.errors`` (``LauncherError`` and its subclasses). This file
imports nothing, so any layer can be imported without loading the ones below it.
"""
