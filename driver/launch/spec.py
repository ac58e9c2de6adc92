"""What to start, where (``LaunchSpec``), and how to run ssh (``SSHSettings``).

Both are frozen values validated on construction; nothing here starts a process.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from driver.errors import LaunchSpecError
from rendezvous import env

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def valid_env_name(name: str) -> bool:
    """True if ``name`` can be a shell variable (and so can be set on a remote host)."""
    return isinstance(name, str) and bool(_ENV_NAME.match(name))


@dataclass(frozen=True)
class LaunchSpec:
    """What to start, where, and how to label its output.

    ``env`` holds the job's own variables, added to the inherited environment; it is
    copied, so later changes of the caller's dict do not leak in. ``cwd`` None means
    the driver's working directory at launch time (on an ssh host too). ``label``
    defaults to ``host:slot`` and prefixes output lines until a rank is known (a ps
    shard, which never has a rank, is labelled ``psI``). ``log_path``, if set, receives
    the process's output lines unprefixed (``--log-dir``).

    Raises:
        LaunchSpecError: an empty command, non-string arguments, a negative slot, a
            variable name that is not ``[A-Za-z_][A-Za-z0-9_]*`` or a value with NUL.
    """

    host: str
    slot: int
    command: Sequence[str]  # any sequence, kept as a tuple
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    cwd: str | None = None
    label: str = ""
    log_path: str | None = None

    def __post_init__(self):
        command = tuple(self.command) if not isinstance(self.command, str) else None
        if not command or not all(isinstance(a, str) for a in command):
            raise LaunchSpecError(
                f"command must be a non-empty sequence of strings, got {self.command!r}"
            )
        if any("\0" in a for a in command):
            raise LaunchSpecError("command arguments must not contain NUL")
        if not isinstance(self.host, str) or not self.host:
            raise LaunchSpecError(f"host must be a non-empty string, got {self.host!r}")
        if not isinstance(self.slot, int) or self.slot < 0:
            raise LaunchSpecError(f"slot must be a non-negative int, got {self.slot!r}")
        variables = dict(self.env)
        for name, value in variables.items():
            if not valid_env_name(name):
                raise LaunchSpecError(f"bad environment variable name {name!r}")
            if not isinstance(value, str) or "\0" in value:
                raise LaunchSpecError(
                    f"environment variable {name} must be a string without NUL, got {value!r}"
                )
        # Frozen: the normalized values are set once, here.
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "env", variables)
        object.__setattr__(self, "label", self.label or f"{self.host}:{self.slot}")


@dataclass(frozen=True)
class SSHSettings:
    """How ``SSHLauncher`` runs ssh.

    ``extra_options`` are raw ssh arguments placed before the defaults, so that an
    ``-o Name=value`` there wins (ssh keeps the first value it sees for an option).
    ``remote_grace`` is the time between SIGTERM and SIGKILL on the remote host when the
    connection is lost (rounded up to whole seconds). ``forward_env`` and
    ``env_exclude`` (``fnmatch`` patterns) choose which of the driver's variables go to
    the worker (see ``driver.launch.ssh_wrapper``).

    Raises:
        LaunchSpecError: a value out of range.
    """

    port: int | None = None
    identity_file: str | None = None
    user: str | None = None
    ssh_binary: str = "ssh"
    connect_timeout: float = 10.0
    server_alive_interval: float = 5.0
    server_alive_count: int = 3
    remote_grace: float = 5.0
    forward_env: bool = True
    env_exclude: tuple[str, ...] = ()
    extra_options: Sequence[str] = ()  # any sequence, kept as a tuple

    def __post_init__(self):
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise LaunchSpecError(f"ssh port must be 1..65535, got {self.port!r}")
        for name in ("connect_timeout", "server_alive_interval", "remote_grace"):
            if not getattr(self, name) > 0:
                raise LaunchSpecError(f"SSHSettings.{name} must be > 0")
        if not (isinstance(self.server_alive_count, int) and self.server_alive_count > 0):
            raise LaunchSpecError("SSHSettings.server_alive_count must be a positive int")
        object.__setattr__(self, "env_exclude", tuple(self.env_exclude))
        object.__setattr__(self, "extra_options", tuple(self.extra_options))


def ssh_settings_from_env(environ: Mapping[str, str]) -> SSHSettings:
    """``SSHSettings`` whose extra options come from ``ELASTIC_SSH_OPTIONS`` (shell words,
    e.g. ``-p 2222 -i ~/.ssh/cluster -o ProxyJump=gw``): how a user points elastic-run's
    ssh at their cluster without a flag per ssh option. ~/.ssh/config works as usual.

    Raises:
        LaunchSpecError: the value does not split into shell words.
    """
    text = env.text(env.ENV_SSH_OPTIONS, "", environ) or ""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise LaunchSpecError(f"{env.ENV_SSH_OPTIONS}={text!r}: {exc}") from None
    return SSHSettings(extra_options=words)
