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
