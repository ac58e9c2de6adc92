"""PID 1 of a test host (see ``benchmarks/harness/netns.py``); runs inside the host's namespaces.

    python -m benchmarks.harness.netns_init HOSTNAME SSHD_CONFIG

Sets the host name (its own UTS namespace), mounts a private tmpfs on /dev/shm (its
own mount namespace), starts the host's sshd in the foreground and then does what an
init does: reaps every orphan the host's processes leave behind, so nothing lingers as
a zombie. It prints ``ready`` once sshd runs. When it exits (SIGTERM, or sshd dies) the
kernel SIGKILLs every process of the host's PID namespace: killing this one process
tears the whole host down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    hostname, sshd_config = argv
    subprocess.run(["hostname", hostname], check=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=1777,size=1g", "tmpfs", "/dev/shm"], check=True
    )
    # /proc of this PID namespace, so ps and /proc show only the host's processes.
    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=True)
    # Exiting is the teardown: the kernel then SIGKILLs the rest of the namespace.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", sshd_config], stdin=subprocess.DEVNULL
    )
    print("ready", flush=True)
    while True:
        try:
            pid, _status = os.wait()
        except ChildProcessError:
            break
        if pid == sshd.pid:
            print("sshd exited", file=sys.stderr, flush=True)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
