"""``python -m driver.programs.world_spare -- COMMAND [ARG...]``: a warm spare of restart
mode (``elastic-run --restart-workers --spares N``), started ahead of need on its host.

A world's restart costs each of its workers a process start and its program's imports
(``import torch`` alone takes one to three seconds) before the program forms its
process group. A spare pays that ahead of need, then waits:

1. it imports what the program imports at its top level (``python_command``: the
   modules of its source's top-level ``import`` statements that are not the program's
   own files, found from the program's folder, a module that fails to import left to
   the program to report);
2. it registers (``WorkerInfo`` under a lease, as a worker of ours does: the driver
   counts it ready), and waits for a seat under ``JobKeys.world_seat`` for as long as
   the job keeps it (the driver stops it with SIGTERM; a spare whose driver is gone
   stops itself);
3. given a seat, it ends its registration, meets rank 0 of its world as every worker
   of one does (``world_entry.meet_master``), takes the program's environment
   (``world_entry.program_env``, with the seat's variables), and runs the program in
   this process, as ``python`` would: ``sys.argv``, ``sys.path[0]`` (the script's
   folder; the working directory for ``-m``), ``__main__``. torch, when imported, is
   given the OpenMP thread count the environment now names (it read the spare's
   at its import).

A command that is no plain Python program of this interpreter (``python_command``;
the driver refuses ``--spares`` for a command that is none) is still given its seat,
then started as a fresh process (``exec``): correct, only not faster.

Exit codes: the program's; before it runs, those of ``world_entry`` (1: rank 0 cannot
be met or the store cannot be used, each with one line on stderr).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from driver.programs import python_command
from driver.programs.python_command import PythonProgram
from driver.programs.world_entry import (
    Entry,
    command_line,
    gloo_interface,
    meet_master,
    program_env,
    run,
)
from elastic.orphan import exit_when_orphaned
from rendezvous import env, open_store
from rendezvous.errors import ElasticError, RendezvousConnectionError
from rendezvous.keys import JobKeys
from rendezvous.schema.workers import WorkerInfo
from rendezvous.schema.worlds import WorldSeat
from rendezvous.store import KVStore

SPARE_ONLY = (env.ENV_SPARE, env.ENV_PROGRESS_INTERVAL, env.ENV_HANG_TIMEOUT)
"""What the driver tells a spare that a world's worker is not told (a spare starts as
an elastic worker does; a world's program is a torchrun script, not watched for hangs)."""

#: how long one wait for a seat lasts before the spare waits again (each is a watch)
SEAT_WAIT = 60.0


def warm_program(command: Sequence[str], environ: Mapping[str, str]) -> PythonProgram | None:
    """``command`` when this process can run it as it is (a plain Python program of this
    very interpreter), else None."""
    program = python_command.python_program(command)
    if program is None:
        return None
    found = python_command.program_interpreter(program, environ)
    return program if python_command.same_interpreter(found, sys.executable) else None


def program_folder(program: PythonProgram) -> str:
    """What Python puts first on ``sys.path`` for ``program``: the script's folder (its
    links followed), the working directory for ``-m``."""
    if program.module:
        return os.getcwd()
    return os.path.dirname(os.path.realpath(program.target))


def preload(program: PythonProgram) -> list[str]:
    """Import what ``program`` imports at its top level, but its own files (those in its
    folder); returns the modules imported. One that fails is left to the program, which
    says why when it imports it."""
    folder = program_folder(program)
    if program.module:
        found = python_command.module_source(program.target)
        source = found[0] if found is not None else ""
    else:
        try:
            with open(program.target, encoding="utf-8") as f:
                source = f.read()
        except OSError:
            return []
    done = []
    for name in python_command.top_imports(source):
        if _is_own(name, folder):
            continue
        with contextlib.suppress(Exception):  # the program's own import reports it
            importlib.import_module(name)
            done.append(name)
    return done


def _is_own(name: str, folder: str) -> bool:
    """Module ``name`` is a file of the program's own folder (it may run code at its
    import that the program means to run once, in its world)."""
    top = name.partition(".")[0]
    return os.path.exists(os.path.join(folder, top + ".py")) or os.path.isdir(
        os.path.join(folder, top)
    )


def register(store: KVStore, keys: JobKeys, environ: Mapping[str, str]):
    """Register this spare (its worker id, host and spare index from ``environ``) under a
    lease kept alive; returns the lease. A lease found lost ends the spare: its driver
    can no longer count on it.

    Raises:
        RendezvousError: the store cannot be used.
    """
    worker_id = environ[env.ENV_WORKER_ID]
    slot = env.integer(env.ENV_SLOT, 0, environ, minimum=0)
    info = WorkerInfo(worker_id, environ.get(env.ENV_HOST, ""), slot, os.getpid(), "")
    lease = store.grant_lease(env.tuned(env.ENV_LEASE_TTL, 10, environ))
    store.put(keys.worker(worker_id), info.to_json(), lease=lease)
    lease.keep_alive(on_lost=lambda exc: _give_up(f"its registration was lost: {exc}"))
    return lease


def wait_for_seat(store: KVStore, key: str) -> WorldSeat:
    """The seat written under ``key``, however long that takes.

    Raises:
        RendezvousError: the store cannot be used.
    """
    while True:
        try:
            kv = store.wait_for(key, lambda kv: kv is not None, SEAT_WAIT)
        except RendezvousConnectionError:
            continue  # nothing yet: wait again
        assert kv is not None  # (wait_for returns what the predicate accepted)
        return WorldSeat.from_json(kv.value)


def become(program: PythonProgram, variables: Mapping[str, str]) -> None:
    """Run ``program`` in this process with ``variables`` as its environment, as
    ``python`` would have run it (see the module docstring)."""
    os.environ.clear()
    os.environ.update(variables)
    torch = sys.modules.get("torch")
    threads = variables.get(env.OMP_NUM_THREADS, "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    sys.argv = program.argv
    sys.path[0] = program_folder(program)
    if program.module:
        runpy.run_module(program.target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(program.target, run_name="__main__")


def _give_up(why: str) -> NoReturn:
    print(f"elastic-run: a spare stops: {why}", file=sys.stderr, flush=True)
    os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    """Warm up, wait for a seat, then run the command in it (see the module docstring);
    the exit code when the command did not run here."""
    command = command_line(argv, "driver.programs.world_spare")
    if command is None:
        return 2
    environ = dict(os.environ)
    orphan_watch = exit_when_orphaned()
    program = warm_program(command, environ)
    if program is not None:
        preload(program)
    try:
        keys = JobKeys(environ[env.ENV_JOB_ID])
        with open_store(environ[env.ENV_RENDEZVOUS], environ.get(env.ENV_SECRET, "")) as store:
            lease = register(store, keys, environ)
            seat = wait_for_seat(store, keys.world_seat(environ[env.ENV_WORKER_ID]))
            lease.revoke()
            environ = {k: v for k, v in environ.items() if k not in SPARE_ONLY}
            environ.update(seat.variables)
            entry = Entry.from_env(environ)
            master = meet_master(entry, store)
        variables = program_env(environ, master, entry.local_size, gloo_interface(entry, environ))
    except (ElasticError, KeyError) as exc:
        print(f"elastic-run: a spare cannot take its seat: {exc}", file=sys.stderr)
        return 1
    orphan_watch.set()
    if program is None:
        return run(command, variables)
    become(program, variables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
