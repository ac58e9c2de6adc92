"""Starting the job's processes (workers and ps shards) on a host, locally or over ssh.

The package is in layers, each module using only the ones above it:

* ``spec``: what to start (``LaunchSpec``) and how to run ssh (``SSHSettings``);
  validated frozen values, no I/O;
* ``ssh_wrapper``: the POSIX-sh wrapper an ssh worker runs under and the ssh command
  line (pure functions);
* ``output``: forwarding of a process's output, line by line and prefixed;
* ``process``: a started process's life: exit, signals to its process group, stop with
  a grace period (``WorkerProcess``, ``SSHWorkerProcess``, ``stop_all``, ``STOP_GRACE``);
* ``launchers``: ``Launcher.launch(spec)``, the one launch signature for workers and
  shards, and ``get_launcher(name)`` over ``LAUNCHER_NAMES``.

Errors are in ``driver.errors`` (``LauncherError`` and its subclasses). This file
imports nothing, so any layer can be imported without loading the ones below it.
"""
