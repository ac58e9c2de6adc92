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
* ``assignments/``: the driver's side of the per-host agents (``driver.agent``),
  behind the same interface (``AgentLauncher``: processes handed to them as assignments
  through the store), and what the job's loop asks of them (``AgentService``);

What a launched process runs on its host around the job's command (restart mode's
``world_entry`` and ``world_spare``, the ``ray`` launcher's ``ray_step``) is
``driver.programs``, with ``python_command`` (what a Python command imports).

Errors are in ``driver.errors`` (``LauncherError`` and its subclasses). This file
imports nothing, so any layer can be imported without loading the ones below it.
"""
