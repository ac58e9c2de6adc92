"""The wrapper an ssh worker runs under, and the ssh command line (pure functions).

``ssh [options] -- HOST 'exec /bin/sh -c SCRIPT'`` runs a small POSIX-sh wrapper
(``remote_script``) on the host. The ssh process's stdin is the wrapper's control
channel (``encode_env_block`` then control lines):

1. the environment: ``NAME=VALUE`` lines up to an empty line. The variables travel on
   stdin, not on the command line, so that the job secret (``ELASTIC_JOB_SECRET``) never
   shows in ``ps`` on the remote host. What is sent is ``spec.env`` over the driver's
   environment minus the host- and session-specific variables of ``NOT_FORWARDED``
   (HOME, USER, SHELL, SSH_*, XDG_*, TMPDIR, ...) and minus ``SSHSettings.env_exclude``;
   ``SSHSettings(forward_env=False)`` sends ``spec.env`` only. This is the contract's
   "workers inherit elastic-run's environment plus the job's own variables", with PATH,
   PYTHONPATH, VIRTUAL_ENV, ELASTIC_* and anything the user exported included, on the
   usual assumption of identical paths on every host (as with ``mpirun -x``).
2. then ``TERM`` or ``KILL`` lines: the wrapper's watchdog signals the session's process
   group (the worker's whole tree) with that signal.
3. end of file: the driver closed the pipe, the driver died, or the connection is
   gone. sshd does *not* signal a command that has no tty when its connection drops, so
   without this watchdog a killed ssh client would orphan the remote worker. On EOF the
   watchdog sends SIGTERM to the group and SIGKILL after ``SSHSettings.remote_grace``
   seconds (sooner if the worker is gone). The same happens after a normal exit (sshd
   closes the pipe), which also cleans up strays the worker left behind.

The worker runs in the foreground of the wrapper, which ignores the group SIGTERM and
exits with the worker's status, so a worker's exit code comes back through ssh. A
worker killed by signal N reports 128+N over ssh (the shell's convention; locally it is
-N as in ``subprocess``), and 255 means ssh itself failed (or the command exited 255).
How the local side uses the channel (``kill``, ``stop``) is in
``driver.launch.process.SSHWorkerProcess``. A connection that hangs without closing is
noticed locally through ``ServerAliveInterval``; the remote side relies on sshd's TCP
keep-alive (set ``ClientAliveInterval`` on the hosts for faster cleanup after a network
partition).

The login shell on the host must parse ``exec /bin/sh -c '...'`` (sh, bash, dash, zsh,
ksh, fish and csh do: the script has no newline, backslash or ``!``).
"""

from __future__ import annotations

import fnmatch
import math
import shlex
from collections.abc import Mapping, Sequence

from driver.errors import LaunchSpecError
from driver.launch.spec import LaunchSpec, SSHSettings, valid_env_name

NOT_FORWARDED = (
    # who and where the user is on *this* machine: the remote login sets its own
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "HOSTNAME",
    "MAIL",
    "_",
    "TMPDIR",
    # the driver's terminal and desktop session
    "TERM",
    "TERMCAP",
    "COLUMNS",
    "LINES",
    "DISPLAY",
    "XAUTHORITY",
    "WINDOWID",
    "STY",
    "WINDOW",
    "TMUX",
    "TMUX_PANE",
    "LS_COLORS",
    "PS1",
    "PS2",
    "PROMPT_COMMAND",
    "SSH_*",
    "XDG_*",
    "DBUS_*",
    "GPG_AGENT_INFO",
    "KRB5CCNAME",
)
"""Driver variables (``fnmatch`` patterns) never sent to an ssh worker."""

CONTROL_TERM = "TERM"
CONTROL_KILL = "KILL"


def remote_environment(
    spec_env: Mapping[str, str], driver_env: Mapping[str, str], settings: SSHSettings
) -> dict[str, str]:
    """The variables an ssh worker gets on top of its login environment: the driver's
    (unless ``forward_env`` is off) minus ``NOT_FORWARDED`` and ``env_exclude`` and minus
    names a shell cannot set (e.g. ``BASH_FUNC_x%%``), then ``spec_env`` over them."""
    chosen: dict[str, str] = {}
    if settings.forward_env:
        patterns = NOT_FORWARDED + settings.env_exclude
        for name, value in driver_env.items():
            if (
                valid_env_name(name)
                and "\0" not in value
                and not any(fnmatch.fnmatchcase(name, p) for p in patterns)
            ):
                chosen[name] = value
    chosen.update(spec_env)
    return chosen


def encode_env_block(variables: Mapping[str, str]) -> bytes:
    """The environment part of the wrapper's stdin: one ``NAME=VALUE`` line per variable
    and an empty line. A value with a newline or backslash is sent as ``:NAME=ESCAPED``
    with backslash escapes (``\\\\`` and ``\\n``) that the wrapper decodes with
    ``printf %b``; plain values go as they are.

    Raises:
        LaunchSpecError: a name a shell cannot set.
    """
    lines = []
    for name, value in variables.items():
        if not valid_env_name(name):
            raise LaunchSpecError(f"bad environment variable name {name!r}")
        if "\n" in value or "\\" in value:
            escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f":{name}={escaped}")
        else:
            lines.append(f"{name}={value}")
    return ("".join(line + "\n" for line in lines) + "\n").encode("utf-8", "surrogateescape")


def remote_script(command: Sequence[str], cwd: str, remote_grace: float) -> str:
    """The POSIX-sh wrapper run on the ssh host (see the module docstring), on one line.

    Reads the environment block from stdin (exits 125 if the stream ends before the
    empty line), ``cd``s to ``cwd`` (exits 1 if it cannot), starts the stdin watchdog in
    the background, and runs ``command`` in the foreground with stdin from /dev/null,
    exiting with its status. Variables of the wrapper itself start with ``__er_`` and
    are not exported."""
    grace = max(1, math.ceil(remote_grace))
    # No newline, backslash or "!" anywhere (csh and fish parse the outer quoting).
    read_env = (
        "__er_ok=; "
        "while IFS= read -r __er_l; do "
        '[ -z "$__er_l" ] && { __er_ok=1; break; }; '
        "case $__er_l in "
        ':*) __er_l=${__er_l#:}; __er_v=$(printf %bx "${__er_l#*=}"); __er_v=${__er_v%x} ;; '
        "*) __er_v=${__er_l#*=} ;; "
        "esac; "
        'export "${__er_l%%=*}=$__er_v"; '
        "done; "
        '[ -n "$__er_ok" ] || exit 125; '
        "unset __er_ok __er_l __er_v; "
    )
    watchdog = (
        "( trap '' TERM; PATH=/usr/bin:/bin:$PATH; "
        "while IFS= read -r __er_c; do "
        f"case $__er_c in {CONTROL_TERM}) kill -TERM 0 ;; {CONTROL_KILL}) kill -KILL 0 ;; esac; "
        "done; "
        "kill -TERM 0; __er_i=0; "
        f"while [ $__er_i -lt {grace} ] && kill -0 $$ 2>/dev/null; do "
        "sleep 1; __er_i=$((__er_i+1)); done; "
        # fd 3: a background list's stdin would be /dev/null without job control.
        "kill -KILL 0 ) <&3 >/dev/null 2>&1 3<&- & "
    )
    return (
        read_env
        + "exec 3<&0; "
        + f"cd -- {shlex.quote(cwd)} || exit 1; "
        # A handler, not an ignore: the worker (forked later) gets the default action,
        # while this shell outlives the group SIGTERM to report the worker's status.
        + "trap : TERM; "
        + watchdog
        + f"{shlex.join(command)} </dev/null 3<&-; exit $?"
    )


def ssh_argv(host: str, remote_command: str, settings: SSHSettings) -> list[str]:
    """The local argv that runs ``remote_command`` on ``host``.

    Raises:
        LaunchSpecError: the host is empty, has whitespace or starts with ``-``.
    """
    if not host or host.startswith("-") or any(c.isspace() for c in host):
        raise LaunchSpecError(f"bad ssh host {host!r}")
    argv = [
        settings.ssh_binary,
        *settings.extra_options,
        "-T",
        "-x",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        # Hides "Permanently added ... to the list of known hosts" on every worker.
        "-o",
        "LogLevel=ERROR",
        "-o",
        f"ConnectTimeout={max(1, math.ceil(settings.connect_timeout))}",
        "-o",
        f"ServerAliveInterval={max(1, math.ceil(settings.server_alive_interval))}",
        "-o",
        f"ServerAliveCountMax={settings.server_alive_count}",
    ]
    if settings.port is not None:
        argv += ["-p", str(settings.port)]
    if settings.identity_file is not None:
        argv += ["-i", settings.identity_file, "-o", "IdentitiesOnly=yes"]
    if settings.user is not None:
        argv += ["-l", settings.user]
    return argv + ["--", host, remote_command]


def ssh_remote_command(spec: LaunchSpec, cwd: str, settings: SSHSettings) -> str:
    """The one string ssh passes to the remote login shell."""
    return "exec /bin/sh -c " + shlex.quote(remote_script(spec.command, cwd, settings.remote_grace))
