"""One rank of ``benchmarks/gpu_check.py``'s shrink check: after a member is SIGKILLed in
the middle of an allreduce, how long the survivors take from the loss to their next
collective, with a full rebuild (``abort()``, a new group) or with NCCL's shrink
(``ncclCommShrink`` through torch's ``Backend.shrink``, NCCL 2.27 and later).

Three ranks share the one GPU, each with its own ``NCCL_HOSTID`` (a trick for tests
only: NCCL refuses two ranks of one host on one device otherwise). Rank 2 kills
itself; ranks 0 and 1 print one JSON line each: ``{"rank", "mode", "recover_s"}`` or
``{"rank", "mode", "error"}``.

    nccl_shrink.py --rank R --port P --mode rebuild|shrink
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

WORLD = 3


def nccl_group(store: dist.Store, rank: int, size: int) -> Any:
    options = dist.ProcessGroupNCCL.Options()
    options.config.blocking = 0
    group = dist.ProcessGroupNCCL(store, rank, size, options)
    group.eager_connect_single_device(torch.device("cuda", 0))
    return group


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=["rebuild", "shrink"], required=True)
    args = parser.parse_args()
    os.environ["NCCL_HOSTID"] = f"shrink-check-{args.rank}"  # tests only (docstring)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    torch.cuda.set_device(0)
    store = dist.TCPStore(
        "127.0.0.1", args.port, WORLD, args.rank == 0, timeout=timedelta(seconds=60)
    )
    group = nccl_group(dist.PrefixStore("first/", store), args.rank, WORLD)
    data = torch.ones(1 << 20, device="cuda")
    group.allreduce([data]).wait()
    torch.cuda.synchronize()
    store.add("ready", 1)
    store.wait(["ready"])
    if args.rank == 2:
        threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
        group.allreduce([data]).wait()
        torch.cuda.synchronize()
        return 0
    group.allreduce([data]).wait()  # hangs on the GPU: rank 2 dies in it
    time.sleep(0.3)  # rank 2 is dead by now (the ring would have said so in ms)
    lost = time.monotonic()
    try:
        if args.mode == "rebuild":
            group.abort()
            group = nccl_group(dist.PrefixStore("second/", store), args.rank, WORLD - 1)
        else:
            # 1: SHRINK_ABORT, which ends the hung allreduce
            group = group.shrink([2], 1)
        fresh = torch.ones(1 << 20, device="cuda")
        group.allreduce([fresh]).wait()
        torch.cuda.synchronize()
        line = {"rank": args.rank, "mode": args.mode, "recover_s": time.monotonic() - lost}
        line["correct"] = bool((fresh == 2).all())
    except Exception as exc:  # noqa: BLE001 - reported: the check says what failed
        line = {"rank": args.rank, "mode": args.mode, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(line), flush=True)
    os._exit(0)  # (an aborted communicator's teardown is not what is measured)


if __name__ == "__main__":
    sys.exit(main())
