"""The hosts of a Ray cluster (``elastic-run --ray ADDRESS``): its alive nodes, each
named by its address (``NodeManagerAddress``: a route, never a DNS lookup), with
``--slots-per-host`` slots when given, else the node's GPUs, else 1.

A node added (``ray start --address``, the autoscaler) is a new host at the next
discovery; one that dies or is removed leaves (our own failure detection usually finds a
cut node first: its agent's lease, the ring's silence reports).

This process connects to the cluster once, as a Ray driver, when the source is made
(``ray.init`` in the main thread; the ``ray`` extra): Ray installs a SIGTERM handler
there, and the driver's own handlers are put back at once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any

from driver.errors import DiscoveryError
from driver.hosts.discovery import HostDiscovery
from driver.hosts.slots import HostSlots


def node_slots(node: dict[str, Any], given: int | None) -> int:
    """The slots of a Ray node record: ``given``, else its GPUs, else 1."""
    if given is not None:
        return given
    gpus = int(float(node.get("Resources", {}).get("GPU", 0) or 0))
    return gpus if gpus > 0 else 1


def alive_hosts(nodes: list[dict[str, Any]], given: int | None) -> tuple[HostSlots, ...]:
    """The alive nodes of ``ray.nodes()`` as hosts, in the order Ray lists them (one
    host per address: a node that rejoined beside its dead self counts once)."""
    seen: dict[str, int] = {}
    for node in nodes:
        address = node.get("NodeManagerAddress")
        if node.get("Alive") and address and address not in seen:
            seen[address] = node_slots(node, given)
    return tuple(HostSlots(a, s) for a, s in seen.items())


class RayDiscovery(HostDiscovery):
    """The alive nodes of the Ray cluster at ``address`` (module docstring).

    Raises (when made):
        DiscoveryError: Ray is not installed, or the cluster cannot be reached.
    """

    def __init__(self, address: str, given_slots: int | None = None):
        self.address = address
        self.given_slots = given_slots
        try:
            import ray
        except ImportError:
            raise DiscoveryError(
                "--ray needs Ray: pip install 'elastic[ray]' (or ray) into this Python"
            ) from None
        self._ray = ray
        kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
            raise DiscoveryError(f"--ray {address}: cannot join the cluster: {exc}") from None
        finally:
            for signum, handler in kept.items():
                signal.signal(signum, handler)

    def __repr__(self) -> str:
        return f"RayDiscovery({self.address!r})"

    def close(self) -> None:
        """Leave the cluster as a Ray driver does at its end (``ray.shutdown``: its
        ``atexit`` hook, which the driver's exit skips); best effort."""
        with contextlib.suppress(Exception):
            self._ray.shutdown()

    def find_hosts(self) -> tuple[HostSlots, ...]:
        """The cluster's alive nodes now.

        Raises:
            DiscoveryError: the cluster's control store (GCS) did not answer.
        """
        try:
            return alive_hosts(self._ray.nodes(), self.given_slots)
        except (ConnectionError, RuntimeError, self._ray.exceptions.RayError) as exc:
            raise DiscoveryError(f"--ray {self.address}: cannot list the nodes: {exc}") from None
