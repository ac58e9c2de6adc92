"""A ring worker process for the tests, driven by JSON lines on stdin; it answers with
JSON lines ("events") on stdout.

    python -m benchmarks.harness.comm.worker --secret S [--bind ADDRESS]

On start it opens a RingListener on ADDRESS (default loopback) and prints {"event": "listening", "address", "pid"}.
Commands ({"cmd": ...}):
    form        round, rank, addresses, settings -> "formed" {transport} | "error"
    battery     seed, big -> "battery" {checks} | "error"
    loop        nbytes, close_after (optional, s): allreduce until one raises (another
                thread closes the communicator close_after seconds after the first call)
                -> "looping" after the first call, then "raised" {t, type, msg, calls,
                next_type, next_s}
    allreduce   value, busy_s (pure-Python busy work first) -> "result" {sum} | "raised"
    close_blocked  allreduce that no peer joins; another thread closes the communicator
                once the call is running -> "raised" {t, type, msg, close_to_raise_s}
    burst       count, elems: back-to-back allreduces, a barrier, then close -> "burst" {ok}
    call        what (allreduce/broadcast/allgather/barrier), shape, dtype, op, root
                -> "result" {shape} | "raised"
    stats       -> "stats" {peer_failures, network_threads (a hierarchical leader's)}
    exit        close everything and exit 0
Asynchronously: "peer_failure" {t, type, msg, rank, direct} from on_peer_failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback

import numpy as np

from benchmarks.harness.comm.battery import run_battery
from elastic.comm import CommSettings, Membership, RingCommunicator, RingListener

_out_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def describe(e: BaseException) -> dict:
    return {
        "t": time.time(),
        "type": type(e).__name__,
        "msg": str(e),
        "mro": [c.__name__ for c in type(e).__mro__],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--secret", required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    args = ap.parse_args()
    listener = RingListener(args.bind, secret=args.secret)
    emit("listening", address=listener.address, pid=__import__("os").getpid())
    comm: RingCommunicator | None = None
    failures = []

    def on_failure(err):
        failures.append(err)
        emit("peer_failure", **describe(err), rank=err.rank, direct=err.direct)

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        try:
            if cmd == "form":
                comm = RingCommunicator(
                    Membership(msg["round"], msg["rank"], tuple(msg["addresses"]), args.secret),
                    listener,
                    CommSettings(**msg.get("settings", {})),
                    on_peer_failure=on_failure,
                )
                emit("formed", transport=comm.transport, round=msg["round"])
            elif cmd == "stats":
                threads = [t for t in threading.enumerate() if t.name.startswith("elastic-hier-")]
                emit("stats", peer_failures=len(failures), network_threads=len(threads))
            elif cmd == "exit":
                break
            elif comm is None:
                raise RuntimeError(f"{cmd!r} before 'form'")
            elif cmd == "battery":
                emit("battery", checks=run_battery(comm, msg.get("seed", 0), msg.get("big", True)))
            elif cmd == "loop":
                x = np.ones(msg["nbytes"] // 4, dtype=np.float32)
                calls = 0
                try:
                    while True:
                        comm.allreduce(x)
                        calls += 1
                        if calls == 1:
                            emit("looping")
                            if msg.get("close_after") is not None:
                                threading.Timer(
                                    msg["close_after"], comm.close, args=("closed mid-loop",)
                                ).start()
                except Exception as e:  # noqa: BLE001 - reported to the test
                    info = describe(e)
                    t0 = time.perf_counter()
                    try:
                        comm.allreduce(x)
                        nxt = "none"
                    except Exception as e2:  # noqa: BLE001
                        nxt = type(e2).__name__
                    emit(
                        "raised",
                        **info,
                        calls=calls,
                        next_type=nxt,
                        next_s=time.perf_counter() - t0,
                    )
            elif cmd == "allreduce":
                end = time.monotonic() + msg.get("busy_s", 0)
                spins = 0
                while time.monotonic() < end:  # Python work that holds the GIL
                    spins += sum(range(1000))
                t0 = time.perf_counter()
                try:
                    got = comm.allreduce(np.full(4, msg.get("value", 1.0)))
                    emit("result", sum=float(got[0]), wait_s=time.perf_counter() - t0)
                except Exception as e:  # noqa: BLE001
                    emit("raised", **describe(e), wait_s=time.perf_counter() - t0)
            elif cmd == "close_blocked":
                closed_at: list[float] = []

                def closer(comm=comm, closed_at=closed_at):
                    deadline = time.monotonic() + 10
                    while not comm._in_op and time.monotonic() < deadline:
                        time.sleep(0.001)  # polling a condition with a deadline
                    closed_at.append(time.perf_counter())
                    comm.close("closed by another thread")

                th = threading.Thread(target=closer)
                th.start()
                try:
                    comm.allreduce(np.ones(1000, dtype=np.float32))
                    emit("result", sum=0.0)
                except Exception as e:  # noqa: BLE001
                    emit(
                        "raised", **describe(e), close_to_raise_s=time.perf_counter() - closed_at[0]
                    )
                th.join()
            elif cmd == "burst":
                # Back-to-back collectives, then close at once: ranks that finish first
                # close while slower ones still receive their last bytes.
                ok, err = True, None
                try:
                    for i in range(msg["count"]):
                        n = msg["elems"][i % len(msg["elems"])]
                        got = comm.allreduce(np.full(n, 1.0, dtype=np.float32))
                        assert got.size == 0 or got[0] == comm.size
                    comm.barrier()
                except Exception as e:  # noqa: BLE001
                    ok, err = False, f"{type(e).__name__}: {e}"
                comm.close("burst done")
                emit("burst", ok=ok, error=err)
            elif cmd == "call":
                x = np.ones(msg.get("shape", [3]), dtype=msg.get("dtype", "float32"))
                what = msg["what"]
                try:
                    shape = None  # a barrier returns nothing
                    if what == "allreduce":
                        shape = comm.allreduce(x, op=msg.get("op", "sum")).shape
                    elif what == "broadcast":
                        shape = comm.broadcast(x, root=msg.get("root", 0)).shape
                    elif what == "allgather":
                        shape = comm.allgather(x).shape
                    else:
                        comm.barrier()
                    emit("result", shape=None if shape is None else list(shape))
                except Exception as e:  # noqa: BLE001
                    emit("raised", **describe(e))
            else:
                emit("error", type="ValueError", msg=f"unknown command {cmd}")
        except Exception as e:  # noqa: BLE001 - reported to the test
            emit("error", **describe(e), tb=traceback.format_exc())
    if comm is not None:
        comm.close("worker exit")
    listener.close()


if __name__ == "__main__":
    main()
