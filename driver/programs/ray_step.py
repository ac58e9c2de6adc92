"""One process on one node of a Ray cluster, run from here as if it ran here: ``python -m
driver.programs.ray_step ADDRESS NODE_IP CWD COMMAND...`` (the ``ray`` launcher's local
side, as ``ssh`` is the ``ssh`` launcher's).

This process connects to the cluster at ``ADDRESS`` (a Ray job of its own), places one
actor on the alive node whose address is ``NODE_IP`` (``NodeAffinitySchedulingStrategy``,
not soft: the process runs there or not at all), and has it start ``COMMAND`` as an
ordinary process in ``CWD`` with this process's environment (so the ring, shared
memory and the agent's children work as on any host). Then, as ssh does:

* the remote output comes out here, line by line, on the same stream;
* SIGTERM or SIGINT here is sent to the remote process group (once each);
* this process exits with the remote status (128+N for a signal N); 255 when the actor
  or its node is lost, 127 when no alive node has that address, 126 when the command
  cannot start;
* when this process dies (SIGKILL), its Ray job ends and Ray destroys the actor, whose
  child dies with it (``PR_SET_PDEATHSIG``).

Ray is imported here only (the extra ``ray``): ``elastic-run`` itself never imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any

from rendezvous.signals import relay_signals

LOST = 255
NO_NODE = 127
CANNOT_START = 126
READ_WAIT = 0.2  # seconds a read of the remote output waits for a line
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class RemoteProcess:
    """The actor: one process on its node, its output queued for the caller to read."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self._open = 0

    def start(self, command: list[str], env: dict[str, str], cwd: str) -> int:
        """Start ``command``; its pid, or -errno when it cannot start."""
        try:
            self._proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            return -(exc.errno or 1)
        for fd, pipe in ((1, self._proc.stdout), (2, self._proc.stderr)):
            self._open += 1
            threading.Thread(target=self._pump, args=(fd, pipe), daemon=True).start()
        return self._proc.pid

    def _pump(self, fd: int, pipe: Any) -> None:
        for line in iter(pipe.readline, b""):
            self._lines.put((fd, line))
        self._lines.put((fd, b""))  # this stream's end

    def read(self) -> list[tuple[int, bytes]]:
        """The output lines that came (waits up to ``READ_WAIT`` for the first); an
        empty line marks a stream's end."""
        try:
            lines = [self._lines.get(timeout=READ_WAIT)]
        except queue.Empty:
            return []
        while len(lines) < 256:
            try:
                lines.append(self._lines.get_nowait())
            except queue.Empty:
                break
        return lines

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it just ended
                os.killpg(self._proc.pid, signum)


def _node_id(ray: Any, address: str) -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeManagerAddress") == address:
            return str(node["NodeID"])
    return None


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(
            "usage: python -m driver.programs.ray_step ADDRESS NODE_IP CWD COMMAND...",
            file=sys.stderr,
        )
        return 2
    address, node_ip, cwd, command = argv[0], argv[1], argv[2], argv[3:]
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    node = _node_id(ray, node_ip)
    if node is None:
        print(f"ray: no alive node of the cluster has address {node_ip}", file=sys.stderr)
        return NO_NODE
    actor: Any = (
        ray.remote(RemoteProcess)
        .options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            num_cpus=0,
            max_concurrency=4,
            max_restarts=0,
        )
        .remote()
    )
    sent: set[int] = set()

    def forward(signum: int) -> None:
        if signum not in sent:
            sent.add(signum)
            actor.signal.remote(signal.SIGTERM if signum == signal.SIGINT else signum)

    try:
        pid: int = ray.get(actor.start.remote(command, dict(os.environ), cwd))
        if pid < 0:
            print(
                f"ray: cannot start {command[0]!r} on {node_ip}: {os.strerror(-pid)}",
                file=sys.stderr,
            )
            return CANNOT_START
        relay_signals((signal.SIGTERM, signal.SIGINT), forward)
        ended = actor.wait.remote()
        streams = {1: sys.stdout.buffer, 2: sys.stderr.buffer}
        open_streams = 2
        while open_streams:
            for fd, line in ray.get(actor.read.remote()):
                if not line:
                    open_streams -= 1
                    continue
                streams[fd].write(line)
                streams[fd].flush()
        return _status(ray.get(ended))
    except ray.exceptions.RayActorError as exc:
        print(f"ray: the process on {node_ip} was lost: {exc}".splitlines()[0], file=sys.stderr)
        return LOST


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
