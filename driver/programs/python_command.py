"""What a command line runs when it is a Python program, and what that program imports
at its top (pure, but for ``program_interpreter`` and ``module_source``, which look).

A warm spare of restart mode (``driver.programs.world_spare``) runs a Python program in
its own process, after importing ahead of need what the program imports: so it must
know that the command is one (``python_program``), which interpreter it names, and
which modules its source imports at its top level (``top_imports``).

Only the plain forms are understood: ``python SCRIPT [ARG...]`` and
``python -m MODULE [ARG...]`` (any ``python``, ``python3`` or ``python3.N``, by name or
path). Interpreter options (``-u``, ``-X ...``, ``-c``) make a command no plain
program: it runs as a fresh process.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?")


@dataclass(frozen=True)
class PythonProgram:
    """A command that runs a Python program: its ``interpreter`` as the command names
    it, the ``script`` path or (``module``) the module name it runs, and its ``args``."""

    interpreter: str
    target: str
    module: bool
    args: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        """``sys.argv`` as the program sees it (``-m``: the module's name first; runpy
        sets it to the module's file while the module runs, as Python does)."""
        return [self.target, *self.args]


def python_program(command: Sequence[str]) -> PythonProgram | None:
    """``command`` as a plain Python program (see the module docstring), else None."""
    if len(command) < 2 or not _INTERPRETER.fullmatch(os.path.basename(command[0])):
        return None
    if command[1] == "-m":
        if len(command) < 3 or command[2].startswith("-"):
            return None
        return PythonProgram(command[0], command[2], True, tuple(command[3:]))
    if command[1].startswith("-"):
        return None
    return PythonProgram(command[0], command[1], False, tuple(command[2:]))


def program_interpreter(program: PythonProgram, environ: Mapping[str, str]) -> str | None:
    """The path of the interpreter ``program`` names, found as a shell finds it on
    ``environ``'s PATH; None when there is none."""
    return shutil.which(program.interpreter, path=environ.get("PATH"))


def same_interpreter(found: str | None, running: str) -> bool:
    """``found`` is the interpreter ``running`` (``sys.executable``): the same file, in
    the same folder (a virtual environment's ``python`` links to the system's, but
    imports from its own folder)."""
    if not found:
        return False
    found, running = os.path.abspath(found), os.path.abspath(running)
    same_file = os.path.realpath(found) == os.path.realpath(running)
    return same_file and os.path.dirname(found) == os.path.dirname(running)


def top_imports(source: str) -> list[str]:
    """The absolute modules ``source`` imports at its top level (its body, and the
    bodies of its top-level ``try``, ``if`` and ``with`` blocks), in order, once each;
    ``[]`` when it does not parse (the program then says so itself)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: dict[str, None] = {}
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import):
            names.update(dict.fromkeys(alias.name for alias in node.names))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names[node.module] = None
        elif isinstance(node, (ast.Try, ast.If, ast.With)):
            pending[:0] = [*node.body, *getattr(node, "orelse", [])]
    names.pop("__future__", None)
    return list(names)


def module_source(name: str) -> tuple[str, str] | None:
    """The source text and file of module ``name`` (importing its parent packages, as
    finding it must); None when it has no Python source."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    if spec is not None and spec.submodule_search_locations is not None:
        main = importlib.util.find_spec(f"{name}.__main__")  # ``-m package`` runs this
        origin = main.origin if main is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            return f.read(), origin
    except OSError:
        return None
