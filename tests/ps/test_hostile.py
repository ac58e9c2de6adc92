"""What a hostile client can do to a running ps shard, measured from outside the shard
process (/proc): calls that never send a body and connections that never speak hold no
thread and stop no training, a burst of connections that runs the shard out of file
descriptors does not end its bulk listener, and a client with the secret that sends
malformed requests gets one line back (and the shard logs one line, not a traceback)."""

from __future__ import annotations

import socket
import struct
import time

import grpc
import numpy as np
import pytest

from elastic.netio import client_handshake, make_nonce
from ps.bulk import HANDSHAKE, MAGIC, recv_json, send_json
from ps.client.link import ShardLink
from ps.errors import PSConfigError, PSHeaderError, PSShapeError
from ps.protocol import SERVICE, Hello
from ps.settings import BulkLimits
from ps.shard import checkpoint as ck
from rendezvous.errors import ElasticError
from rendezvous.net import auth
from rendezvous.net.rpc_client import RpcClient
from rendezvous.net.rpc_wire import MalformedRequest, frame
from tests.support.hostile import (
    close_all,
    fds,
    limit_fds,
    never_sending_calls,
    silent_connections,
    threads,
)
from tests.support.jobs import wait_until
from tests.support.ps.harness import PSJob

# Payloads above the client's chunk size travel over the bulk port.
CHUNK = 16 << 10
VALUES = np.zeros((200, 50))  # 80 KB
# the most threads a shard's bulk port spends on connections that have not proven the secret
HANDSHAKE_THREADS = BulkLimits().max_handshakes


def _bulk_port(job: PSJob, index: int = 0) -> int:
    link = ShardLink(index, job.addresses[index], job.secret)
    try:
        return Hello.from_dict(link.request("Hello")[0]).bulk_port
    finally:
        link.close()


def _train(client, steps: int) -> None:
    """Push and pull through the bulk port ``steps`` times."""
    for _ in range(steps):
        client.push({"v": np.ones_like(VALUES)})
        client.pull()


@pytest.mark.timeout(120)
def test_held_calls_and_silent_connections_do_not_stop_training(embedded_server, tmp_path):
    """600 gRPC calls that send headers and never a body (no proof, a wrong one, and a
    right one) and 300 bulk connections that never speak: training goes on through both
    channels while they are held, and the shard grows no thread per held call."""
    with PSJob(embedded_server, tmp_path, 1).start() as job:
        pid = job.shards[0].proc.pid
        client = job.client(chunk_bytes=CHUNK, lanes=2, retry_deadline=20.0, call_timeout=10.0)
        client.init({"v": VALUES}, optimizer="sgd", lr=1.0)
        _train(client, 2)
        before = threads(pid)
        method = f"/{SERVICE}/Push"
        incarnation = job.records[0].incarnation
        held = [
            never_sending_calls(job.addresses[0], 200, 2, (), method),
            never_sending_calls(
                job.addresses[0],
                200,
                2,
                auth.call_metadata(auth.make_secret(), method, b"", incarnation),
                method,
            ),
            never_sending_calls(
                job.addresses[0],
                200,
                2,
                lambda: auth.call_metadata(job.secret, method, b"", incarnation),
                method,
            ),
        ]
        silent = silent_connections(_bulk_port(job), 300)
        try:
            for _channels, calls, _release in held[:2]:
                codes = {c.exception(timeout=30).code() for c in calls}
                assert codes == {grpc.StatusCode.UNAUTHENTICATED}
            t0 = time.monotonic()
            _train(client, 30)
            fresh = job.client(chunk_bytes=CHUNK, lanes=2, retry_deadline=20.0)
            np.testing.assert_array_equal(fresh.pull()["v"], VALUES - 32)  # new connections
            assert time.monotonic() - t0 < 30
            # gRPC: no thread per held call; bulk: at most the handshake cap's threads
            assert threads(pid) <= before + HANDSHAKE_THREADS + 6
            assert not any(c.done() for c in held[2][1])  # held, and harmless
            # the silent connections are closed by the shard once their time to prove
            # the secret is up, while their client still holds them open
            wait_until(
                lambda: threads(pid) <= before + 4,
                3 * BulkLimits().handshake_timeout,
                "the shard to drop the connections that never spoke",
            )
        finally:
            for channels, _calls, release in held:
                release()
                for ch in channels:
                    ch.close()
            close_all(silent)
        wait_until(lambda: threads(pid) <= before + 4, 30, "the shard's threads to settle")
        assert "Traceback" not in job.shard_log(0)


# A shard started through this wrapper has at most FD_LIMIT file descriptors.
FD_LIMIT = 64
_LIMIT_FDS = limit_fds(FD_LIMIT)


@pytest.mark.timeout(120)
def test_bulk_listener_survives_running_out_of_file_descriptors(embedded_server, tmp_path):
    """A shard limited to 64 descriptors gets a burst of 400 silent bulk connections:
    it runs out (EMFILE), closes unproven connections to make room, and goes on serving
    clients old and new, during the burst and after it."""
    with PSJob(embedded_server, tmp_path, 1, wrapper=_LIMIT_FDS).start() as job:
        pid = job.shards[0].proc.pid
        settings = {"chunk_bytes": CHUNK, "lanes": 2, "retry_deadline": 20.0, "call_timeout": 5.0}
        client = job.client(**settings)
        client.init({"v": VALUES}, optimizer="sgd", lr=1.0)
        _train(client, 1)
        before = threads(pid)
        silent = silent_connections(_bulk_port(job), 400)
        try:
            wait_until(
                lambda: (
                    fds(pid) >= FD_LIMIT - 2 or "cannot accept a connection" in job.shard_log(0)
                ),
                30,
                "the shard to run out of file descriptors",
            )
            _train(client, 5)
            during = job.client(**settings)
            np.testing.assert_array_equal(during.pull()["v"], VALUES - 6)
            assert threads(pid) <= before + HANDSHAKE_THREADS + 6
        finally:
            close_all(silent)
        after = job.client(**settings)
        _train(after, 5)
        np.testing.assert_array_equal(after.pull()["v"], VALUES - 11)
        wait_until(lambda: threads(pid) <= before + 4, 30, "the shard's threads to settle")
        assert job.shards[0].proc.poll() is None
        log = job.shard_log(0)
    assert "cannot accept a connection" in log  # it did run out
    assert "Traceback" not in log
    assert log.count("cannot accept a connection") <= 3  # rate-limited, not one per failure


def stamp(metadata) -> float:
    """When a call's proof was made (seconds since the epoch), read off its metadata."""
    return int(dict(metadata)[auth.RPC_METADATA_KEY].split(".")[0]) / 1000


def _request(header: dict, tensors=()) -> bytes:
    """A request as the client frames it: the header, then a ``wire`` message of tensors."""
    return frame(header, [frame({"tensors": list(tensors)})])


def _deep_json(depth: int) -> bytes:
    head = b"[" * depth + b"]" * depth
    return struct.pack("!I", len(head)) + head


@pytest.mark.timeout(120)
def test_malformed_requests_with_the_secret_get_one_line_and_the_shard_goes_on(
    embedded_server, tmp_path
):
    """A client with the secret sends requests that do not parse, headers with fields of
    the wrong type, absurd tensor shapes and optimizer settings: each gets a typed
    one-line error naming what was wrong, the shard logs no traceback and at most one
    line (or two) about malformed calls, and it keeps serving."""
    with PSJob(embedded_server, tmp_path, 1).start() as job:
        rpc = RpcClient(job.addresses[0], SERVICE, job.secret)
        huge = {"name": "w", "dtype": "<f8", "shape": [2**71], "nbytes": 8}
        cases = [
            ("Describe", b"garbage", MalformedRequest, "malformed message"),
            ("Describe", _deep_json(100_000), MalformedRequest, "malformed message"),
            ("Describe", _request({"shard": "0"}), PSHeaderError, "'shard'"),
            ("Describe", _request({}), PSHeaderError, "'shard'"),
            ("Pull", _request({"shard": 0, "names": "w"}), PSHeaderError, "'names'"),
            ("Push", _request({"shard": 0, "client": 5, "seq": 1}), PSHeaderError, "'client'"),
            ("Push", _request({"shard": 0, "client": "c", "seq": "x"}), PSHeaderError, "'seq'"),
            ("Prepare", _request({"shard": 0, "checkpoint_id": [1]}), PSHeaderError, "checkpoint"),
            ("Push", _request({"shard": 0, "client": "c", "seq": 1}, [huge]), PSShapeError, "2361"),
            (
                "Push",
                _request({"shard": 0, "client": "c", "seq": 1}, [7]),
                PSShapeError,
                "metadata",
            ),
            (
                "Create",
                _request({"shard": 0, "optimizer": {"optimizer": "momentum", "momentum": 10**400}}),
                PSConfigError,
                "'momentum'",
            ),
        ]
        try:
            for _ in range(20):  # a flood, not one call
                for method, payload, expected, named in cases:
                    with pytest.raises(ElasticError) as info:
                        rpc.call(method, payload)
                    error = info.value
                    # over the wire a header error arrives as MalformedRequest
                    want = MalformedRequest if expected is PSHeaderError else expected
                    assert isinstance(error, want), (method, payload[:60], error)
                    assert named in str(error) and "\n" not in str(error), str(error)
        finally:
            rpc.close()
        client = job.client()
        client.init({"w": np.zeros(3)})
        assert client.push({"w": np.ones(3)}) == 1
        log = job.shard_log(0)
    assert "Traceback" not in log
    # one line per 10 s, not one per call (two if the flood straddles a window)
    assert len([line for line in log.splitlines() if "malformed" in line]) <= 2


@pytest.mark.timeout(60)
def test_malformed_bulk_requests_with_the_secret_allocate_nothing(embedded_server, tmp_path):
    """On the bulk port, a header that does not parse ends the connection (what follows
    it is unknown) and an upload of an absurd size is a typed error: nothing the size of
    a number a client wrote is allocated, and honest transfers go on."""
    with PSJob(embedded_server, tmp_path, 1).start() as job:
        port = _bulk_port(job)

        def connect() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            client_handshake(sock, job.secret, MAGIC + make_nonce(), HANDSHAKE)
            return sock

        with connect() as sock:  # absurd sizes in a well-formed header: an error reply
            send_json(sock, {"id": "u", "offset": 0, "length": 8, "total": 2**50, "op": "put"})
            sock.sendall(b"\0" * 8)
            reply = recv_json(sock)
            assert reply["error"] == "PSTransferError" and "memory" in reply["message"], reply
            send_json(sock, {"id": 5, "offset": 0, "length": 2**40, "op": "put"})
            reply = recv_json(sock)
            assert reply["error"] == "PSHeaderError" and "'id'" in reply["message"], reply
            assert sock.recv(1) == b""  # and the connection ends
        with connect() as sock:  # a header nested too deep to parse
            head = b"[" * 500_000 + b"]" * 500_000
            sock.sendall(struct.pack("!I", len(head)) + head)
            assert sock.recv(1) == b""
        client = job.client(chunk_bytes=CHUNK)
        client.init({"v": VALUES}, optimizer="sgd", lr=1.0)
        _train(client, 2)
        log = job.shard_log(0)
    assert "Traceback" not in log


@pytest.mark.timeout(60)
def test_a_push_captured_before_a_restart_is_refused_by_the_restarted_shard(
    embedded_server, tmp_path, monkeypatch
):
    """An attacker captures a worker's Push off the network (its metadata, with the proof
    of the secret, and its body). The shard is SIGKILLed and restarted in place from its
    checkpoint, which predates the push; the attacker replays the push well within the
    proof's window. The restarted shard refuses it as made for another incarnation, and
    its state stays the checkpoint's; the worker's own client goes on (it re-reads the
    shard's record)."""
    ckpt = tmp_path / "ckpt"
    job = PSJob(embedded_server, tmp_path, 1, checkpoint_dir=str(ckpt), checkpoint_interval=1.0)
    with job.start():
        client = job.client(retry_deadline=20.0)
        client.init({"w": np.zeros(3)}, optimizer="sgd", lr=1.0)
        assert client.push({"w": np.ones(3)}) == 1
        job.wait_checkpoint(1)  # the next one is a whole interval away
        captured = []  # what the client sent: (method, body, metadata), as a sniffer sees it
        call_metadata = auth.call_metadata

        def recording(secret, method, body, *args, **kwargs):
            metadata = call_metadata(secret, method, body, *args, **kwargs)
            captured.append((method, bytes(body), metadata))
            return metadata

        with monkeypatch.context() as patch:
            patch.setattr(auth, "call_metadata", recording)
            assert client.push({"w": np.ones(3)}) == 2
        [(method, body, metadata)] = [c for c in captured if c[0] == f"/{SERVICE}/Push"]
        job.kill_shard(0)
        loaded = ck.load_newest(str(ckpt))
        assert loaded is not None and loaded.step == 1  # the checkpoint predates the push
        job.restart_shard(0, in_place=True)

        assert time.time() - stamp(metadata) < auth.PROOF_WINDOW / 2  # well within it
        with (
            grpc.insecure_channel(job.addresses[0]) as channel,
            pytest.raises(grpc.RpcError) as info,
        ):
            channel.unary_unary(method)(body, metadata=metadata, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "another incarnation" in info.value.details(), info.value.details()
        assert job.shard_status(0)["step"] == 1
        np.testing.assert_array_equal(job.client().pull()["w"], -np.ones(3))

        assert client.push({"w": np.ones(3)}) == 2  # the restart lost push 2, as said
        np.testing.assert_array_equal(client.pull()["w"], -2 * np.ones(3))
        log = job.shard_log(0)
    assert "Traceback" not in log
    assert f"refused a call of /{SERVICE}/Push: proof made for another incarnation" in log
