"""The control channel between a benchmark and the workers it commands: JSON lines over
TCP, shared by both sides."""

from __future__ import annotations

import json
import socket


class Line:
    """One JSON object per line, both ways, over a connected socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.f = sock.makefile("rwb")

    def send(self, obj) -> None:
        self.f.write(json.dumps(obj).encode() + b"\n")
        self.f.flush()

    def recv(self):
        line = self.f.readline()
        if not line:
            raise EOFError("control connection closed")
        return json.loads(line)


class ControlServer:
    """Where a group's ``world`` workers call back: a listening socket on ``host``, its
    ``address`` handed to the workers, and each connection's first message naming its
    worker's rank."""

    def __init__(self, host: str, world: int, accept_timeout: float):
        self.world = world
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(world)
        self.sock.settimeout(accept_timeout)
        self.address = f"{host}:{self.sock.getsockname()[1]}"

    def accept_ranks(self) -> list[Line]:
        """Every worker's line, in rank order, once each has called and said its rank.

        Raises:
            TimeoutError: a worker did not call within the accept timeout.
        """
        by_rank: dict[int, Line] = {}
        for _ in range(self.world):
            conn, _ = self.sock.accept()
            conn.settimeout(600)
            line = Line(conn)
            by_rank[line.recv()["rank"]] = line
        return [by_rank[r] for r in range(self.world)]

    def close(self) -> None:
        self.sock.close()
