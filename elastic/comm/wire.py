"""Byte formats of the ring data plane (pure encode/decode; no sockets here).

Handshake (one TCP connection per (direction, channel)), the shared challenge/response
of ``elastic.netio`` with the ring's labels (``HANDSHAKE``) and this opening:

    client -> server  HELLO   magic "ELRG", version, channel, round_id, src_rank,
                              dst_rank, world, client nonce            (HELLO_SIZE bytes)
    server -> client  nonce_s + proof_s                                (48 bytes)
                      proof_s = challenge_response(secret, nonce_c, "server" label + HELLO)
    client -> server  proof_c = challenge_response(secret, nonce_s, "client" label + HELLO)
    server -> client  one verdict byte (VERDICT_OK / VERDICT_STALE / VERDICT_CLOSED)

Both proofs bind the HELLO bytes, so a recorded handshake cannot be replayed for another
round or rank, and the two labels stop either side from being used as an oracle for the
other direction. A client that fails the proof gets no verdict: the server just drops it.

Control channel messages: ``type (1) | length (2) | payload``.

Every collective starts with a fixed-size ``OpHeader`` so ranks that disagree on what
they are doing (a different op, dtype, shape, root, or one call out of step) find out
instead of exchanging garbage.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from elastic.netio import NONCE_BYTES, HandshakeLabels

MAGIC = b"ELRG"
VERSION = 1

CHANNEL_DATA = 0
CHANNEL_CTRL = 1
# Between host leaders of a hierarchical round (``transports.hier``): the leaders' TCP ring,
# and beside it a connection that only carries one verdict byte when a leader breaks.
CHANNEL_LEADER_DATA = 2
CHANNEL_LEADER_CTRL = 3
CHANNELS = (CHANNEL_DATA, CHANNEL_CTRL, CHANNEL_LEADER_DATA, CHANNEL_LEADER_CTRL)

# The verdict a host leader sends its neighbouring leaders when its communicator breaks:
# closed on purpose, or broken by a failure (a crash sends nothing: the connection ends).
LEADER_CLOSED_ORDERLY = b"\x01"
LEADER_CLOSED_ABORT = b"\x02"

_HELLO = struct.Struct("!4sBBQiiI")
HELLO_SIZE = _HELLO.size + NONCE_BYTES

VERDICT_OK = 0
VERDICT_STALE = 1  # the server already runs a newer round than the client's
VERDICT_CLOSED = 2  # the server's listener is shutting down

HANDSHAKE = HandshakeLabels(server=b"elastic-ring-server\x00", client=b"elastic-ring-client\x00")


class WireError(ValueError):
    """Bytes that do not follow the format (bad magic, version or length)."""


@dataclass(frozen=True)
class Hello:
    """What a connecting peer claims: which round, who it is, whom it wants, on which channel."""

    channel: int
    round_id: int
    src_rank: int
    dst_rank: int
    world: int
    nonce: bytes


def encode_hello(h: Hello) -> bytes:
    if len(h.nonce) != NONCE_BYTES:
        raise WireError("bad nonce length")
    return (
        _HELLO.pack(MAGIC, VERSION, h.channel, h.round_id, h.src_rank, h.dst_rank, h.world)
        + h.nonce
    )


def decode_hello(data: bytes) -> Hello:
    """Parse HELLO bytes. Raises WireError on a wrong size, magic, version or channel."""
    if len(data) != HELLO_SIZE:
        raise WireError("bad hello length")
    magic, version, channel, round_id, src, dst, world = _HELLO.unpack(data[: _HELLO.size])
    if magic != MAGIC:
        raise WireError("bad magic")
    if version != VERSION:
        raise WireError(f"unsupported version {version}")
    if channel not in CHANNELS:
        raise WireError(f"unknown channel {channel}")
    if world < 1 or not (0 <= src < world) or not (0 <= dst < world):
        raise WireError("ranks out of range")
    return Hello(channel, round_id, src, dst, world, bytes(data[_HELLO.size :]))


# --- control channel ---------------------------------------------------------------

CTRL_HEARTBEAT = 1
CTRL_CLOSING = 2  # payload: origin rank (4) | utf-8 reason; a rank closed on purpose
CTRL_ABORT = 3  # payload: kind (1) | lost rank (4, -1 unknown) | utf-8 message
_CTRL = struct.Struct("!BH")
_ABORT = struct.Struct("!Bi")
_CLOSING = struct.Struct("!i")

ABORT_LOST = 1
ABORT_MISMATCH = 2

MAX_REASON = 512


def encode_ctrl(kind: int, payload: bytes = b"") -> bytes:
    payload = payload[:60000]
    return _CTRL.pack(kind, len(payload)) + payload


def encode_closing(origin_rank: int, reason: str) -> bytes:
    return encode_ctrl(CTRL_CLOSING, _CLOSING.pack(origin_rank) + reason.encode()[:MAX_REASON])


def decode_closing(payload: bytes) -> tuple[int, str]:
    """(origin rank, reason). Raises WireError on a short payload."""
    if len(payload) < _CLOSING.size:
        raise WireError("short closing message")
    return _CLOSING.unpack(payload[: _CLOSING.size])[0], payload[_CLOSING.size :].decode(
        errors="replace"
    )


def encode_abort(kind: int, lost_rank: int | None, reason: str) -> bytes:
    return encode_ctrl(
        CTRL_ABORT,
        _ABORT.pack(kind, -1 if lost_rank is None else lost_rank) + reason.encode()[:MAX_REASON],
    )


def decode_abort(payload: bytes) -> tuple[int, int | None, str]:
    """(kind, lost rank or None, reason). Raises WireError on a short payload."""
    if len(payload) < _ABORT.size:
        raise WireError("short abort message")
    kind, rank = _ABORT.unpack(payload[: _ABORT.size])
    return kind, (None if rank < 0 else rank), payload[_ABORT.size :].decode(errors="replace")


class CtrlParser:
    """Incremental parser: ``feed(bytes)`` returns the complete ``(type, payload)``
    messages seen so far and keeps any partial tail for the next call."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= _CTRL.size:
            kind, length = _CTRL.unpack_from(self._buf)
            if len(self._buf) < _CTRL.size + length:
                break
            out.append((kind, bytes(self._buf[_CTRL.size : _CTRL.size + length])))
            del self._buf[: _CTRL.size + length]
        return out


# --- collective headers --------------------------------------------------------------

KIND_ALLREDUCE = 1
KIND_BROADCAST = 2
KIND_ALLGATHER = 3
KIND_BARRIER = 4
KIND_SETUP = 5
KIND_NAMES = {
    KIND_ALLREDUCE: "allreduce",
    KIND_BROADCAST: "broadcast",
    KIND_ALLGATHER: "allgather",
    KIND_BARRIER: "barrier",
    KIND_SETUP: "setup",
}
OP_CODES = {"sum": 1, "average": 2, "max": 3, "min": 4}

_OPH = struct.Struct("!2sBBhhQQI4x")
OP_HEADER_SIZE = _OPH.size
_OPH_MAGIC = b"EC"


@dataclass(frozen=True)
class OpHeader:
    """Which collective a rank is running. ``dtype_code`` is ``np.dtype.num`` (0 when
    the collective does not fix a dtype up front)."""

    kind: int
    seq: int
    op: int = 0
    dtype_code: int = 0
    root: int = -1
    nelem: int = 0
    shape_crc: int = 0

    def encode(self) -> bytes:
        return _OPH.pack(
            _OPH_MAGIC,
            self.kind,
            self.op,
            self.dtype_code,
            self.root,
            self.seq,
            self.nelem,
            self.shape_crc,
        )

    @classmethod
    def decode(cls, data: bytes) -> OpHeader:
        """Raises WireError when the bytes are not an op header (a desynchronised stream)."""
        if len(data) != OP_HEADER_SIZE:
            raise WireError("bad op header length")
        magic, kind, op, dtype_code, root, seq, nelem, crc = _OPH.unpack(data)
        if magic != _OPH_MAGIC:
            raise WireError("bad op header magic")
        return cls(kind, seq, op, dtype_code, root, nelem, crc)

    def describe(self) -> str:
        name = KIND_NAMES.get(self.kind, f"kind {self.kind}")
        return f"{name} #{self.seq}"


def header_mismatch(mine: OpHeader, theirs: OpHeader) -> str | None:
    """A short description of why two ranks' headers disagree, or None when they agree.

    Every field is compared: callers zero the fields a collective leaves free (the
    broadcast root's shape, the allgather sizes) before building the header."""
    if mine == theirs:
        return None
    if mine.seq != theirs.seq or mine.kind != theirs.kind:
        return f"this rank runs {mine.describe()}, its peer runs {theirs.describe()}"
    for field in ("op", "dtype_code", "root", "nelem", "shape_crc"):
        a, b = getattr(mine, field), getattr(theirs, field)
        if a != b:
            return f"{mine.describe()}: {field} differs ({a} here, {b} on the peer)"
    return "headers differ"


_META_LEN = struct.Struct("!I")


def encode_array_meta(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """dtype and shape of an array, length-prefixed (for broadcast and allgather)."""
    body = dtype.str.encode() + b"\x00" + np.asarray(shape, dtype="<i8").tobytes()
    return _META_LEN.pack(len(body)) + body


def decode_array_meta_body(body: bytes) -> tuple[np.dtype, tuple[int, ...]]:
    """Inverse of ``encode_array_meta`` without its length prefix. Raises WireError."""
    try:
        dstr, rest = bytes(body).split(b"\x00", 1)
        dtype = np.dtype(dstr.decode())
        shape = tuple(int(v) for v in np.frombuffer(rest, dtype="<i8"))
    except (ValueError, TypeError) as e:
        raise WireError(f"bad array meta: {e}") from None
    if any(s < 0 for s in shape):
        raise WireError("negative dimension")
    return dtype, shape


META_LEN_SIZE = _META_LEN.size


def decode_meta_len(data: bytes) -> int:
    return _META_LEN.unpack(data)[0]
