"""The request and reply headers of the ps protocol, shared by the client and the shards.

A request is one ``rendezvous.net.rpc`` frame over gRPC: a JSON header and a payload
(``wire``-encoded tensors). The header is an ``Envelope`` (the shard the caller meant,
the upload holding a large payload, how large a reply may come inline) merged with the
method's arguments; a reply header is the method's reply record, plus a ``Staged``
note when its payload waits on the shard for the bulk port. Payload bytes above the
chunk size travel as ``Part``s over the bulk port (``ps.bulk``). Every header
is a frozen dataclass here, so both ends spell each field once.

The protocol is internal: the client and the shards of one release speak it, nothing
else does, so it may change between releases.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ps.errors import PSHeaderError
from ps.partition import Slice

SERVICE = "elastic.ps.Shard"

# How a push or a wait for a step ended (``StepReply.status``); async pushes are APPLIED.
APPLIED = "applied"  # the step is applied (by this round or an earlier one)
PENDING = "pending"  # still waiting for other ranks: ask again (WaitStep)
SUPERSEDED = "superseded"  # a newer round exists; this round's step was dropped
ROLLED_BACK = "rolled_back"  # the shards restored a checkpoint: pull again, then redo
UNKNOWN = "unknown"  # the shard no longer has this contribution: push it again
FINAL = (APPLIED, ROLLED_BACK, SUPERSEDED)  # a sync step asks no more after these

R = TypeVar("R", bound="Record")
A = TypeVar("A", bound="Record")


def _brief(value: Any) -> str:
    """``repr(value)`` cut to a length fit for a one-line error."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# The JSON types a field annotation names (bool is no int here, though Python says so).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "dict": (dict,),
}


def _conforms(annotation: str, value: Any) -> bool:
    """Whether a JSON ``value`` fits a field annotation such as ``int``,
    ``str | None`` or ``tuple[str, ...]``. A record or slice type fits any value here:
    its own ``from_dict`` checks it (``Record._nested``)."""
    for option in (part.strip() for part in annotation.split("|")):
        if option == "None":
            if value is None:
                return True
        elif option.startswith("tuple[") and option.endswith(", ...]"):
            inner = option[len("tuple[") : -len(", ...]")]
            if isinstance(value, (list, tuple)) and all(_conforms(inner, v) for v in value):
                return True
        elif option not in _JSON_TYPES:
            return True
        elif isinstance(value, _JSON_TYPES[option]) and (
            option == "bool" or not isinstance(value, bool)
        ):
            return not isinstance(value, float) or math.isfinite(value)
    return False


class Record:
    """Base of the headers: ``to_dict``/``from_dict`` of a frozen dataclass whose fields
    are JSON values, records or slices (tuples travel as lists)."""

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[R], raw: Mapping[str, Any]) -> R:
        """The record of the fields of ``raw`` it knows (the others belong to the
        envelope or to ``wire``), each checked against its annotation.

        Raises:
            PSHeaderError: ``raw`` is no mapping, a required field is missing, or a
                field holds a value of another type (the message names the field)."""
        if not isinstance(raw, Mapping):
            raise PSHeaderError(f"bad {cls.__name__} header: not an object but {_brief(raw)}")
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in raw:
                if f.default is dataclasses.MISSING:
                    raise PSHeaderError(f"bad {cls.__name__} header: field {f.name!r} is missing")
                continue
            value = raw[f.name]
            if not _conforms(str(f.type), value):
                raise PSHeaderError(
                    f"bad {cls.__name__} header: field {f.name!r} must be {f.type}, "
                    f"not {_brief(value)}"
                )
            values[f.name] = tuple(value) if isinstance(value, list) else value
        try:
            return cls(**cls._nested(values))
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
            raise PSHeaderError(f"bad {cls.__name__} header: {exc}") from None

    @classmethod
    def _nested(cls, values: dict) -> dict:
        """Hook: turn nested JSON values into their records (default: none)."""
        return values


@dataclass(frozen=True)
class Empty(Record):
    """No arguments, or nothing to say."""


# ------------------------------------------------------------------ envelopes
@dataclass(frozen=True)
class Envelope(Record):
    """What every request carries besides its arguments: the shard index the caller
    meant (so a stale address that now belongs to another shard refuses it), the upload
    holding the payload when it came over the bulk port, and the largest reply payload
    the caller takes inline (a larger one is staged for the bulk port)."""

    shard: int
    upload: str | None = None
    inline_max: int | None = None


@dataclass(frozen=True)
class Staged(Record):
    """A reply whose payload (``total`` bytes) waits on the shard as ``download``."""

    download: str | None = None
    total: int = 0


PUT, GET = "put", "get"


@dataclass(frozen=True)
class Part(Record):
    """Bytes ``[offset, offset + length)`` of the staged transfer ``id`` (an upload of
    ``total`` bytes, or a download), moved over the bulk port by ``op`` (PUT or GET)."""

    id: str
    offset: int
    length: int
    total: int = 0
    op: str = ""


# ------------------------------------------------------------------ data calls
@dataclass(frozen=True)
class Hello(Record):
    """The shard at this address, and its bulk port."""

    index: int
    bulk_port: int


@dataclass(frozen=True)
class VariableInfo(Record):
    slice: Slice
    optimizer: dict

    @classmethod
    def _nested(cls, values: dict) -> dict:
        return {**values, "slice": Slice.from_dict(values["slice"])}


@dataclass(frozen=True)
class Description(Record):
    """A shard's layout and progress (``Describe``)."""

    index: int
    num_shards: int
    mode: str
    step: int
    generation: str
    variables: tuple[VariableInfo, ...] = ()
    split_threshold: int = 0

    @classmethod
    def _nested(cls, values: dict) -> dict:
        return {
            **values,
            "variables": tuple(VariableInfo.from_dict(v) for v in values.get("variables", ())),
        }


@dataclass(frozen=True)
class CreateArgs(Record):
    optimizer: dict  # ``Optimizer.config()`` of the new variables


@dataclass(frozen=True)
class Created(Record):
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PullArgs(Record):
    names: tuple[str, ...] | None = None  # None: every variable of the shard


@dataclass(frozen=True)
class Pulled(Record):
    """The step and generation of a pull's values (their metadata: ``wire``'s)."""

    step: int
    generation: str


@dataclass(frozen=True)
class PushArgs(Record):
    """An async push: ``seq`` counts the pushes of ``client``, so a repeat is not applied
    twice; ``round`` is the pusher's round of the job (-1: a client outside elastic-run's
    rounds), so a worker the job left behind (a host cut off and back) is refused."""

    client: str
    seq: int
    round: int = -1


@dataclass(frozen=True)
class StepArgs(Record):
    """A sync push, or a wait for its step: ``rank`` of ``size`` in round ``round``
    contributes to ``step`` of history ``generation``; the shard answers within ``wait``
    seconds (PENDING if the step is not applied by then)."""

    round: int
    size: int
    rank: int
    step: int
    generation: str
    wait: float = 0.0


@dataclass(frozen=True)
class StepReply(Record):
    """How a push ended (one of the status words above), and the shard's step, history
    and (sync) round after it."""

    status: str
    step: int
    generation: str
    round: int | None = None


@dataclass(frozen=True)
class ReleaseArgs(Record):
    id: str  # a staged download the caller has fetched


@dataclass(frozen=True)
class Restored(Record):
    """``RestoreAll`` (shard 0): every shard is at ``checkpoint_id`` in ``generation``."""

    checkpoint_id: int | None
    generation: str


# ------------------------------------------------------------------ replicas
# What a mirrored update does on the backup (``MirrorOp.kind``, see shard/journal.py).
CREATE, APPLY, META, FULL = "create", "apply", "meta", "full"


@dataclass(frozen=True)
class AttachArgs(Record):
    """A backup asks the primary to mirror to it (``Attach``): its ``address`` and
    ``incarnation`` (the mirror calls' proofs are made for that process), and the
    ``token`` naming this copy, which every mirror call to it carries (a call meant for
    an earlier copy is refused)."""

    address: str
    token: str
    incarnation: str = ""  # "": a backup of an older release (asked of it)


@dataclass(frozen=True)
class MirrorOp(Record):
    """One update of a ``Mirror`` call, numbered ``seq`` in the order the primary made
    it, with the shard's ``step`` and ``generation`` after it; its ``tensors`` are the
    next that many tensors of the call's payload. ``optimizer``: the variables a CREATE
    makes; ``client``, ``client_seq``, ``async_round``, ``round``: what an APPLY leaves
    for a retried push (the de-duplication entry of an async push, the rounds seen);
    ``dedup``: the whole de-duplication table of a FULL copy."""

    seq: int
    kind: str
    step: int
    generation: str
    tensors: int = 0
    optimizer: dict | None = None
    client: str | None = None
    client_seq: int = 0
    async_round: int = -1
    round: int = -1
    dedup: dict | None = None


@dataclass(frozen=True)
class MirrorArgs(Record):
    """The updates a primary sends its backup (``Mirror``), in order."""

    token: str
    ops: tuple[MirrorOp, ...] = ()

    @classmethod
    def _nested(cls, values: dict) -> dict:
        return {**values, "ops": tuple(MirrorOp.from_dict(op) for op in values.get("ops", ()))}


@dataclass(frozen=True)
class Mirrored(Record):
    """The backup holds every update up to ``seq``."""

    seq: int


# ------------------------------------------------------------------ control calls
@dataclass(frozen=True)
class ShardStatus(Record):
    """A shard's progress (``Status``, and the reply of ``Prepare`` and ``Rollback``).
    ``clean``: the state equals checkpoint ``base``; ``version`` counts mutations."""

    index: int
    step: int
    generation: str
    loaded: bool
    base: int | None
    version: int
    clean: bool


@dataclass(frozen=True)
class CheckpointArgs(Record):
    """``Prepare``/``Snapshot``/``Abort`` checkpoint ``checkpoint_id``; ``Align`` its
    shards to step ``target``. ``seal`` (``Prepare``): a checkpoint for a stop, after
    which the shard applies nothing more (``ShardState.prepare``)."""

    checkpoint_id: int
    target: int | None = None
    seal: bool = False


@dataclass(frozen=True)
class Aligned(Record):
    step: int


@dataclass(frozen=True)
class Snapshotted(Record):
    """A shard's file of a checkpoint (for the manifest) and the step it holds."""

    name: str
    size: int
    sha256: str
    step: int


@dataclass(frozen=True)
class RollbackArgs(Record):
    """Become checkpoint ``checkpoint_id`` (None: the empty start) in ``generation``."""

    checkpoint_id: int | None
    generation: str


@dataclass(frozen=True)
class Sealed(Record):
    """``Seal`` (shard 0): the shards' state is in checkpoint ``checkpoint_id`` (None:
    there was nothing to keep) at ``step``, and they apply nothing more for a while."""

    checkpoint_id: int | None
    step: int | None


@dataclass(frozen=True)
class Call(Generic[A, R]):
    """A call one shard makes to another: its method name, argument and reply records."""

    name: str
    args: type[A]
    reply: type[R]


STATUS = Call("Status", Empty, ShardStatus)
PREPARE = Call("Prepare", CheckpointArgs, ShardStatus)
ALIGN = Call("Align", CheckpointArgs, Aligned)
SNAPSHOT = Call("Snapshot", CheckpointArgs, Snapshotted)
ABORT = Call("Abort", CheckpointArgs, Empty)
ROLLBACK = Call("Rollback", RollbackArgs, ShardStatus)
RESTORE_ALL = Call("RestoreAll", Empty, Restored)  # served by shard 0 (its coordinator)
SEAL = Call("Seal", Empty, Sealed)  # shard 0: a checkpoint for a shard that stops
# What ``ShardControl`` serves: every peer call but RESTORE_ALL.
CONTROL_CALLS: tuple[Call, ...] = (STATUS, PREPARE, ALIGN, SNAPSHOT, ABORT, ROLLBACK)
