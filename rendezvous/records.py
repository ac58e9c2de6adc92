"""The records the store interface speaks in: settings, keys with their revisions,
events, transaction operations and results (pure data; both backends and every caller
share them). ``rendezvous.store`` re-exports them."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import cast

PUT = "put"
DELETE = "delete"


@dataclass(frozen=True)
class StoreSettings:
    """How long calls may take and how much they may carry."""

    request_timeout: float = 5.0  # one attempt of one call
    retry_deadline: float = 30.0  # total time a call keeps retrying through an outage
    connect_timeout: float = 5.0  # ``open_store(check=True)``: first contact
    watch_reconnect_deadline: float = 60.0  # a watch gives up after this long without its store
    max_value_bytes: int = 1536 * 1024  # etcd's default request limit is 1.5 MiB


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    def to_dict(self) -> dict:
        return {
            "k": self.key,
            "v": base64.b64encode(self.value).decode(),
            "c": self.create_revision,
            "m": self.mod_revision,
            "n": self.version,
            "l": self.lease,
        }

    @classmethod
    def from_dict(cls, d: dict) -> KeyValue:
        return cls(d["k"], base64.b64decode(d["v"]), d["c"], d["m"], d["n"], d["l"])


@dataclass(frozen=True)
class Event:
    """One change. ``revision`` is the store revision of the change (the deletion's own
    revision for a delete); ``kv`` is the new value (for a delete: the key, empty value)."""

    type: str
    kv: KeyValue

    @property
    def key(self) -> str:
        return self.kv.key

    @property
    def value(self) -> bytes:
        return self.kv.value

    @property
    def revision(self) -> int:
        return self.kv.mod_revision

    def to_dict(self) -> dict:
        return {"t": self.type, "kv": self.kv.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        return cls(d["t"], KeyValue.from_dict(d["kv"]))


@dataclass(frozen=True)
class Compare:
    """A transaction guard: ``target`` of ``key`` compared by ``op`` with ``value``.

    targets: "mod" (mod revision), "create" (create revision), "version", "value";
    a missing key has revisions and version 0 and never equals a value."""

    key: str
    target: str
    op: str
    value: int | bytes

    TARGETS = ("mod", "create", "version", "value")
    OPS = ("==", "!=", "<", ">")

    def __post_init__(self):
        if self.target not in self.TARGETS or self.op not in self.OPS:
            raise ValueError(f"bad compare {self.target} {self.op}")

    def to_dict(self) -> dict:
        v = (
            base64.b64encode(cast(bytes, self.value)).decode()
            if self.target == "value"
            else self.value
        )
        return {"k": self.key, "t": self.target, "o": self.op, "v": v}

    @classmethod
    def from_dict(cls, d: dict) -> Compare:
        v = base64.b64decode(d["v"]) if d["t"] == "value" else int(d["v"])
        return cls(d["k"], d["t"], d["o"], v)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0

    def to_dict(self) -> dict:
        return {
            "op": "put",
            "k": self.key,
            "v": base64.b64encode(self.value).decode(),
            "l": self.lease,
        }


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False

    def to_dict(self) -> dict:
        return {"op": "delete", "k": self.key, "p": self.prefix}


def op_from_dict(d: dict) -> Put | Delete:
    if d["op"] == "put":
        return Put(d["k"], base64.b64decode(d["v"]), d["l"])
    return Delete(d["k"], d["p"])


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
