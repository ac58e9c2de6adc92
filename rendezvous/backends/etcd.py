"""The etcd v3 backend, on the gRPC stubs that the ``etcd3`` package generates.

We drive the stubs directly rather than ``etcd3.Etcd3Client`` because we need what
that client does not offer: several endpoints with failover, watches from a revision
that we resume ourselves, and typed errors that say whether a request was sent.

Endpoints: one gRPC channel at a time, to the current endpoint; a call that cannot
connect moves the client to the next endpoint before the retry (``_on_connection_error``).
"""

from __future__ import annotations

import queue
import ssl
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from rendezvous import env
from rendezvous.backends.memory import prefix_end
from rendezvous.errors import (
    LeaseNotFoundError,
    NotSentError,
    RendezvousAuthError,
    RendezvousConfigError,
    RendezvousConnectionError,
    StoreLoginRefused,
    WatchCompactedError,
)
from rendezvous.net.grpc_runtime import grpc
from rendezvous.net.rpc_client import translate_rpc_error
from rendezvous.net.url import Endpoint
from rendezvous.store import (
    DELETE,
    PUT,
    Compare,
    Delete,
    Event,
    KeyValue,
    KVStore,
    Put,
    StoreSettings,
    TxnResult,
)


def _import_stubs():
    """etcd3's generated modules. Raises RendezvousConfigError when protobuf was already
    loaded with a native runtime that cannot load them (the trap in docs/DESIGN.md)."""
    try:
        with warnings.catch_warnings():
            # Its protobuf-3 era code uses descriptor calls that newer runtimes deprecate.
            warnings.simplefilter("ignore", DeprecationWarning)
            from etcd3 import etcdrpc
        return etcdrpc
    except TypeError as exc:  # "Descriptors cannot be created directly"
        raise RendezvousConfigError(
            "the etcd client needs PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python set before "
            f"protobuf is first imported (open the store earlier, or set it): {exc}"
        ) from None
    except ImportError as exc:
        raise RendezvousConfigError(f"the etcd backend needs the etcd3 package: {exc}") from None


_CHANNEL_OPTIONS = [
    # Notice a dead or stalled server on an idle watch stream. etcd refuses pings more
    # often than every 5 s by default (--grpc-keepalive-min-time), so stay above it; and
    # pings with no call open (a client that only reads now and then) count against the
    # client there (PermitWithoutStream is off by default): etcd answers them with a
    # GOAWAY "too_many_pings", which gRPC prints on stderr. A watch is a call: it is
    # still kept alive.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Fail fast on a dead endpoint so we can move to the next one.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A client is a connection of its own, as with the embedded store (``rpc.CLIENT_OPTIONS``
    # says why): etcd's --max-concurrent-streams is per connection too.
    ("grpc.use_local_subchannel_pool", 1),
]


ENV_USER = env.ENV_ETCD_USER
ENV_PASSWORD = env.ENV_ETCD_PASSWORD
ENV_CA_CERT = env.ENV_ETCD_CA_CERT
ENV_CERT = env.ENV_ETCD_CERT
ENV_KEY = env.ENV_ETCD_KEY


@dataclass(frozen=True)
class EtcdCredentials:
    """How to prove ourselves to etcd: user/password (etcd auth) and TLS files (a CA to
    trust the servers, and a client certificate and key when they ask for one).

    TLS is used when the URL says ``etcds://`` (``tls_required``) and, as before that
    scheme existed, whenever a CA or a client certificate is given (with ``etcd://``
    too: a file given is never ignored). Without a CA file the servers' certificates
    are checked against the system's roots (``system_roots``).

    ``from_env`` reads ``ELASTIC_ETCD_USER``/``_PASSWORD``/``_CA_CERT``/``_CERT``/``_KEY``:
    elastic-run's environment passes to its workers and shards, so the whole job uses
    them.

    Raises:
        RendezvousConfigError: a password without a user, a certificate without its
            key or a key without its certificate (naming the variables).
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_cert: str | None = None
    cert: str | None = None
    key: str | None = None
    tls_required: bool = False  # the URL said etcds://

    def __post_init__(self):
        if self.password and not self.user:
            raise RendezvousConfigError(f"{ENV_PASSWORD} is set but {ENV_USER} is not")
        if bool(self.cert) != bool(self.key):
            raise RendezvousConfigError(f"{ENV_CERT} and {ENV_KEY} go together: set both")

    @classmethod
    def from_env(cls, environ, tls: bool = False) -> EtcdCredentials:
        """The credentials ``environ`` holds; ``tls``: the URL said ``etcds://``.

        Raises:
            RendezvousConfigError: as the class does.
        """
        return cls(
            user=environ.get(ENV_USER) or None,
            password=environ.get(ENV_PASSWORD),
            ca_cert=environ.get(ENV_CA_CERT) or None,
            cert=environ.get(ENV_CERT) or None,
            key=environ.get(ENV_KEY) or None,
            tls_required=tls,
        )

    @property
    def tls(self) -> bool:
        return self.tls_required or bool(self.ca_cert or self.cert)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC's TLS credentials from the files (read now: a missing file is said at
        once, not at the first call).

        Raises:
            RendezvousConfigError: a file cannot be read (naming its variable).
        """

        def read(path, name):
            if not path:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise RendezvousConfigError(
                    f"{name}={path}: cannot read it: {exc.strerror or exc}"
                ) from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_cert, ENV_CA_CERT) or system_roots(),
            private_key=read(self.key, ENV_KEY),
            certificate_chain=read(self.cert, ENV_CERT),
        )


def system_roots() -> bytes | None:
    """The CA certificates this machine trusts, from the bundle OpenSSL uses
    (``SSL_CERT_FILE`` when set, else the distribution's, e.g.
    ``/etc/ssl/certs/ca-certificates.crt``); None when there is none, and gRPC then
    uses the roots it ships. (gRPC never reads the system's store by itself: an etcd
    certificate from a CA installed on the machine, as companies do, would be refused.)"""
    path = ssl.get_default_verify_paths().cafile
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read() or None
    except OSError:
        return None


def _key_range(key: str, prefix: bool) -> tuple[bytes, bytes]:
    return key.encode(), (prefix_end(key).encode() if prefix else b"")


def _kv(kv) -> KeyValue:
    return KeyValue(
        kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.version, kv.lease
    )


class EtcdStore(KVStore):
    scheme = "etcd"

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        settings: StoreSettings = StoreSettings(),
        credentials: EtcdCredentials = EtcdCredentials(),
    ):
        super().__init__(settings)
        if not endpoints:
            raise RendezvousConfigError("etcd store needs at least one endpoint")
        self._rpc = _import_stubs()
        self.credentials = credentials
        self._channel_credentials = credentials.channel_credentials() if credentials.tls else None
        self._metadata: tuple = ()
        self.endpoints = tuple(endpoints)
        self._lock = threading.Lock()
        self._index = 0
        self._channel: grpc.Channel | None = None
        self._retired: grpc.Channel | None = None
        self._stubs: tuple[Any, ...] = ()  # KV, Lease, Watch, Auth: set by _connect
        self._connect(0)

    @property
    def endpoint(self) -> Endpoint:
        return self.endpoints[self._index]

    def _connect(self, index: int) -> None:
        # The previous channel is retired, not closed at once: calls other threads started
        # on it a moment ago finish (or fail and retry) instead of being cancelled.
        if self._retired is not None:
            self._retired.close()
        self._retired = self._channel
        self._index = index % len(self.endpoints)
        if self._channel_credentials is not None:
            self._channel = grpc.secure_channel(
                str(self.endpoint), self._channel_credentials, options=_CHANNEL_OPTIONS
            )
        else:
            self._channel = grpc.insecure_channel(str(self.endpoint), options=_CHANNEL_OPTIONS)
        self._stubs = (
            self._rpc.KVStub(self._channel),
            self._rpc.LeaseStub(self._channel),
            self._rpc.WatchStub(self._channel),
            self._rpc.AuthStub(self._channel),
        )
        self._endpoint_generation += 1
        self._metadata = ()  # a token is per member: authenticate again on first use

    def _authenticate(self) -> tuple:
        """The metadata every call carries: etcd's auth token when a user is configured.
        Raises StoreLoginRefused for a wrong user or password."""
        if not self.credentials.user or self._metadata:
            return self._metadata
        try:
            token = (
                self._stubs[3]
                .Authenticate(
                    self._rpc.AuthenticateRequest(
                        name=self.credentials.user, password=self.credentials.password or ""
                    ),
                    timeout=self.settings.request_timeout,
                )
                .token
            )
        except ValueError as exc:
            raise NotSentError(f"etcd authenticate at {self.endpoint}: {exc}") from None
        except grpc.RpcError as exc:
            if "authentication failed" in (exc.details() or ""):
                raise StoreLoginRefused(
                    f"etcd at {self.endpoint} refused user "
                    f"{self.credentials.user!r} (its password: {ENV_PASSWORD}): "
                    f"{exc.details()}"
                ) from None
            raise translate_rpc_error(exc, f"etcd authenticate at {self.endpoint}") from None
        self._metadata = (("token", token),)
        return self._metadata

    def _on_connection_error(self, generation: int) -> None:
        if len(self.endpoints) > 1:
            with self._lock:
                # Several threads fail on one dead member at once: move once, not once each.
                if generation == self._endpoint_generation and not self._closed:
                    self._connect(self._index + 1)

    def _invoke(self, stub_index: int, method: str, request, what: str):
        stub = self._stubs[stub_index]
        metadata = self._authenticate()
        try:
            return getattr(stub, method)(
                request, timeout=self.settings.request_timeout, metadata=metadata
            )
        except ValueError as exc:  # the channel was retired and closed under this call
            raise NotSentError(f"etcd {what} at {self.endpoint}: {exc}") from None
        except grpc.RpcError as exc:
            details = (exc.details() or "").lower()
            if "user name is empty" in details and not self.credentials.user:
                raise RendezvousAuthError(
                    f"etcd at {self.endpoint} requires a user: set {ENV_USER} and {ENV_PASSWORD}"
                ) from None
            if "invalid auth token" in details or "user name is empty" in details:
                self._metadata = ()  # expired token (etcd restarted, TTL): refused, not applied
                raise NotSentError(f"etcd {what} at {self.endpoint}: {exc.details()}") from None
            if "permission denied" in details:
                raise RendezvousAuthError(
                    f"etcd {what} at {self.endpoint}: {exc.details()} "
                    f"(user {self.credentials.user!r})"
                ) from None
            if "lease not found" in details:
                raise LeaseNotFoundError(f"etcd at {self.endpoint}: {exc.details()}") from None
            if "compacted" in details:
                raise WatchCompactedError(f"etcd at {self.endpoint}: {exc.details()}") from None
            raise translate_rpc_error(exc, f"etcd {what} at {self.endpoint}") from None

    # ---- KV ----
    def _range(self, key: str, prefix: bool) -> tuple[list[KeyValue], int]:
        start, end = _key_range(key, prefix)
        resp = self._invoke(
            0,
            "Range",
            self._rpc.RangeRequest(
                key=start,
                range_end=end,
                sort_order=self._rpc.RangeRequest.ASCEND,
                sort_target=self._rpc.RangeRequest.KEY,
            ),
            "range",
        )
        return [_kv(kv) for kv in resp.kvs], resp.header.revision

    def _compare(self, c: Compare):
        m = self._rpc.Compare
        msg = m(
            key=c.key.encode(),
            result={"==": m.EQUAL, "!=": m.NOT_EQUAL, "<": m.LESS, ">": m.GREATER}[c.op],
            target={"mod": m.MOD, "create": m.CREATE, "version": m.VERSION, "value": m.VALUE}[
                c.target
            ],
        )
        if c.target == "mod":
            msg.mod_revision = c.value
        elif c.target == "create":
            msg.create_revision = c.value
        elif c.target == "version":
            msg.version = c.value
        else:
            msg.value = bytes(c.value)
        return msg

    def _op(self, op: Put | Delete):
        if isinstance(op, Put):
            return self._rpc.RequestOp(
                request_put=self._rpc.PutRequest(
                    key=op.key.encode(), value=op.value, lease=op.lease
                )
            )
        start, end = _key_range(op.key, op.prefix)
        return self._rpc.RequestOp(
            request_delete_range=self._rpc.DeleteRangeRequest(key=start, range_end=end)
        )

    def _txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete],
    ) -> TxnResult:
        resp = self._invoke(
            0,
            "Txn",
            self._rpc.TxnRequest(
                compare=[self._compare(c) for c in compares],
                success=[self._op(o) for o in success],
                failure=[self._op(o) for o in failure],
            ),
            "txn",
        )
        return TxnResult(resp.succeeded, resp.header.revision)

    # ---- leases ----
    def _grant(self, ttl: int) -> int:
        return self._invoke(1, "LeaseGrant", self._rpc.LeaseGrantRequest(TTL=ttl), "lease grant").ID

    def _keepalive(self, lease_id: int) -> int:
        responses = self._invoke(
            1, "LeaseKeepAlive", iter([self._rpc.LeaseKeepAliveRequest(ID=lease_id)]), "keep-alive"
        )
        try:
            for resp in responses:
                if resp.TTL <= 0:
                    raise LeaseNotFoundError(f"lease {lease_id:x} not found (expired or revoked)")
                return resp.TTL
        except ValueError as exc:
            raise NotSentError(f"etcd keep-alive at {self.endpoint}: {exc}") from None
        except grpc.RpcError as exc:
            raise translate_rpc_error(exc, f"etcd keep-alive at {self.endpoint}") from None
        finally:
            # Ended here, not left to the garbage collector's ``__del__`` at some later
            # moment (one at interpreter exit can hang: rendezvous.process_exit).
            responses.cancel()
        raise LeaseNotFoundError(f"lease {lease_id:x}: keep-alive got no answer")

    def _revoke(self, lease_id: int) -> None:
        self._invoke(1, "LeaseRevoke", self._rpc.LeaseRevokeRequest(ID=lease_id), "lease revoke")

    # ---- watches ----
    def _open_watch(
        self, prefix: str, start_revision: int
    ) -> tuple[Iterator[tuple[list[Event], int | None]], Callable[[], None]]:
        start, end = _key_range(prefix, True)
        create = self._rpc.WatchRequest(
            create_request=self._rpc.WatchCreateRequest(
                key=start, range_end=end, start_revision=start_revision, progress_notify=True
            )
        )
        # The request side must stay open: etcd ends the watch when the client half-closes.
        done: queue.Queue = queue.Queue()

        def requests():
            yield create
            done.get()

        try:
            call = self._stubs[2].Watch(requests(), metadata=self._authenticate())
        except ValueError as exc:
            raise NotSentError(f"etcd watch at {self.endpoint}: {exc}") from None
        endpoint = self.endpoint

        def cancel():
            done.put(None)
            call.cancel()

        def batches() -> Iterator[tuple[list[Event], int | None]]:
            try:
                for resp in call:
                    if resp.compact_revision:
                        raise WatchCompactedError(
                            f"etcd at {endpoint}: revision {start_revision} was compacted "
                            f"(oldest kept: {resp.compact_revision})"
                        )
                    if resp.canceled:
                        if "auth" in resp.cancel_reason or "token" in resp.cancel_reason:
                            self._metadata = ()  # authenticate again before reopening
                        raise RendezvousConnectionError(
                            f"etcd at {endpoint} cancelled the watch: {resp.cancel_reason}"
                        )
                    events = [
                        Event(PUT if ev.type == ev.PUT else DELETE, _kv(ev.kv))
                        for ev in resp.events
                    ]
                    # A progress notification (no events, not the creation answer) says
                    # every event up to its header revision has been sent.
                    progress = resp.header.revision if not events and not resp.created else None
                    yield events, progress
            except grpc.RpcError as exc:
                raise translate_rpc_error(exc, f"etcd watch at {endpoint}") from None
            finally:
                done.put(None)

        return batches(), cancel

    def _close(self) -> None:
        for channel in (self._retired, self._channel):
            if channel is not None:
                channel.close()
