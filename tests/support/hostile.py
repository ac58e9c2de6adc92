"""What a hostile client sends, and how a server process is measured from outside, for
the hostile tests (one server in ``tests/rendezvous`` and ``tests/ps``, a whole
job in ``tests/system/faults/test_hostile_job.py``).

Probes speak to an address with no secret: gRPC calls with no proof or a wrong one
(small, oversized, or headers that never send a body), raw bytes (garbage, a truncated
or oversized frame, a fake handshake), connections that never speak, and raw HTTP/2
connections that send the preface and SETTINGS (and optionally open calls) and are
held open. Each returns what the server did, for the test to judge. Gauges read a
process's threads, file descriptors and resident memory from /proc; ``limit_fds``
starts a server with few descriptors.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc

from rendezvous.net import auth

#: how long a probe waits for the server to end a connection it refused
CLOSE_TIMEOUT = 20.0


# ------------------------------------------------------------------------ /proc gauges


def proc_status(pid: int, field: str) -> int:
    """A number of /proc/<pid>/status (``Threads``, ``VmRSS`` in KiB, ...)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    return proc_status(pid, "VmRSS") / 1024


@contextlib.contextmanager
def rss_peaks(pids: Sequence[int], interval: float = 0.05) -> Iterator[dict[int, float]]:
    """The highest resident memory (MiB) of each of ``pids`` while the block runs,
    sampled every ``interval`` seconds by a thread (filled in as it goes)."""
    peaks = {pid: rss_mib(pid) for pid in pids}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            for pid in pids:
                with contextlib.suppress(OSError, KeyError):  # a process that ended
                    peaks[pid] = max(peaks[pid], rss_mib(pid))

    sampler = threading.Thread(target=sample, name="rss-peaks", daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join(timeout=5)


def limit_fds(limit: int) -> tuple[str, ...]:
    """A command prefix that runs the rest of the command line with at most ``limit``
    file descriptors, soft and hard (a server cannot raise it back: what it does with
    few descriptors is what is tested)."""
    return (
        sys.executable,
        "-c",
        "import os, resource, sys; n = int(sys.argv[1]); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])",
        str(limit),
    )


# ------------------------------------------------------------------------- gRPC probes


def never_sending_calls(
    address: str,
    count: int,
    connections: int,
    metadata: Sequence | Callable[[], Sequence] = (),
    method: str = "/elastic.rendezvous.KV/Range",
):
    """``count`` calls of a unary ``method`` that send headers and never a body, spread
    over ``connections`` connections; ``metadata`` is the same for every call, or a
    function making each call's (a proof is good for one call). Returns (channels,
    calls, release): ``release()`` ends the request streams."""
    stop = threading.Event()

    def never():
        stop.wait(120)
        return
        yield  # a generator that yields nothing until released

    channels = [
        grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(connections)
    ]
    # Each connection made (and the server's settings known) before its calls start: a
    # call that finds its channel still connecting after a failed first attempt fails
    # fast with UNAVAILABLE, which says nothing about how the server treats the call.
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=30)
    calls = []
    for i in range(count):
        call = channels[i % connections].stream_unary(method)
        each = metadata() if callable(metadata) else metadata
        calls.append(call.future(never(), metadata=each, timeout=60))
    return channels, calls, stop.set


def unauthenticated_calls(address: str, methods: Sequence[str], body_bytes: int) -> list:
    """One call of each of ``methods`` with no proof and one with a proof of a wrong
    secret, each with a body of ``body_bytes``: the status code each got (``OK`` if one
    was answered)."""
    body = os.urandom(min(body_bytes, 1 << 16)) * max(1, body_bytes >> 16)
    codes = []
    options = [("grpc.max_send_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(address, options=options) as channel:
        for method in methods:
            call = channel.unary_unary(method)
            wrong = auth.call_metadata(auth.make_secret(), method, body, auth.new_incarnation())
            for metadata in ((), wrong):
                try:
                    call(body, metadata=metadata, timeout=30)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
    return codes


# -------------------------------------------------------------------------- raw probes


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _until_closed(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent until it closed the connection, or None if it kept it open
    for ``timeout`` seconds."""
    sock.settimeout(timeout)
    received = b""
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return received
            received += chunk
    except (ConnectionResetError, BrokenPipeError):
        return received
    except TimeoutError:
        return None


def sends_then_closed(address: str, payload: bytes, timeout: float = CLOSE_TIMEOUT) -> bool:
    """Send ``payload`` (garbage, a truncated or oversized frame) and wait: True when
    the server ended the connection within ``timeout`` (it refused what it read)."""
    with socket.create_connection(_split(address), timeout=10) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(payload)
        return _until_closed(sock, timeout) is not None


def fake_handshake(
    address: str, opening: bytes, reply_bytes: int, proof_bytes: int
) -> bytes | None:
    """A handshake with no secret: send ``opening`` (the client's first message, well
    formed), read the server's ``reply_bytes`` challenge, answer ``proof_bytes`` random
    bytes. What the server sent after that, once it closed (``b""`` when it sent
    nothing: refused), or None if it kept the connection open."""
    with socket.create_connection(_split(address), timeout=10) as sock:
        sock.sendall(opening)
        sock.settimeout(10)
        challenge = b""
        while len(challenge) < reply_bytes:
            chunk = sock.recv(reply_bytes - len(challenge))
            if not chunk:
                return b""  # refused the opening itself
            challenge += chunk
        sock.sendall(os.urandom(proof_bytes))
        return _until_closed(sock, CLOSE_TIMEOUT)


def garbage_payloads(magic: bytes = b"") -> list[bytes]:
    """Raw payloads for a port whose first message starts with ``magic``: random bytes,
    a frame cut short, and one whose length prefix claims 4 GiB."""
    return [
        os.urandom(64 << 10),
        magic + b"\x01",
        magic + struct.pack("!I", 0xFFFFFFFF) + os.urandom(1024),
    ]


def silent_connections(port: int, count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """``count`` connections to ``port`` that never send a byte (connects in flight
    beyond the listener's backlog complete as it accepts)."""
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.setblocking(False)
        s.connect_ex((host, port))
        socks.append(s)
    return socks


def close_all(socks: Sequence[socket.socket]) -> None:
    for s in socks:
        s.close()


# ------------------------------------------------------------------- raw HTTP/2 probes

#: what every HTTP/2 client sends first (RFC 9113, 3.4)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_HEADERS, _H2_SETTINGS = 0x1, 0x4
_H2_END_HEADERS = 0x4


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("!I", len(payload))[1:] + struct.pack("!BBI", kind, flags, stream) + payload


def _hpack_string(value: bytes) -> bytes:
    assert len(value) < 127  # a 7-bit length, no Huffman coding: enough for a probe
    return bytes([len(value)]) + value


def h2_request_headers(path: str, authority: str) -> bytes:
    """An HPACK block opening a gRPC call of ``path`` with no metadata (no proof of the
    secret): static-table :method POST and :scheme http, then literals not indexed (no
    dynamic table state to keep)."""
    block = bytes([0x83, 0x86])  # :method POST, :scheme http
    block += b"\x04" + _hpack_string(path.encode())  # :path
    block += b"\x01" + _hpack_string(authority.encode())  # :authority
    for name, value in ((b"content-type", b"application/grpc"), (b"te", b"trailers")):
        block += b"\x00" + _hpack_string(name) + _hpack_string(value)
    return block


def h2_connections(
    address: str, count: int, streams: int = 0, path: str = "/probe/Open", timeout: float = 20.0
) -> list[socket.socket]:
    """``count`` connections to ``address`` that each send the HTTP/2 preface and an
    empty SETTINGS frame, then open ``streams`` calls of ``path`` (HEADERS with no
    proof and no END_STREAM: the request body never comes), and are held open, never
    read (what the server sends piles up in the kernel's buffers). Connects are all in
    flight at once (one blocking connect each would wait out a full backlog one by
    one); each sends once connected, within ``timeout`` seconds in all. A connection
    the server refuses or closes is kept all the same: ``h2_open`` counts the held."""
    host, port = _split(address)
    opening = H2_PREFACE + _h2_frame(_H2_SETTINGS, 0, 0)
    block = h2_request_headers(path, address)
    # client streams have odd ids, increasing (RFC 9113, 5.1.1)
    opening += b"".join(
        _h2_frame(_H2_HEADERS, _H2_END_HEADERS, 2 * i + 1, block) for i in range(streams)
    )
    socks = []
    with selectors.DefaultSelector() as waiting:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.setblocking(False)
            socks.append(s)
            s.connect_ex((host, port))
            waiting.register(s, selectors.EVENT_WRITE)
        deadline = time.monotonic() + timeout
        while waiting.get_map() and time.monotonic() < deadline:
            for key, _ in waiting.select(timeout=max(0.0, deadline - time.monotonic())):
                s = key.fileobj  # type: ignore[assignment]
                waiting.unregister(s)
                with contextlib.suppress(OSError):  # refused or reset: the server's choice
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        s.send(opening)  # a fresh socket's buffer takes it whole
    return socks


def h2_open(socks: Sequence[socket.socket]) -> int:
    """How many of ``socks`` the server still holds open (a closed one reads EOF or a
    reset; bytes it sent, such as its SETTINGS, are read away)."""
    held = 0
    for s in socks:
        try:
            while True:
                chunk = s.recv(1 << 16, socket.MSG_DONTWAIT)
                if not chunk:
                    break  # closed by the server
        except BlockingIOError:
            held += 1  # nothing more to read, and not closed
        except OSError:
            pass  # reset or never connected
    return held
