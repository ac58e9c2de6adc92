"""When the job's store last failed to answer in time (``StoreTrouble``), as the driver's
health probe saw it: what tells a lease that lapsed because its holder was cut off from
one that lapsed because the store itself stalled (``driver.policy.lapses``).
"""

from __future__ import annotations

from driver.policy.lapses import lapse_explained
from rendezvous.store_reach import StoreReach


class StoreTrouble(StoreReach):
    """The store as the driver's probe found it (``rendezvous.store_reach``), and which
    lapsed leases that explains."""

    def explains_lapse(self) -> bool:
        """``lapse_explained`` as of now."""
        return lapse_explained(self.latest(), self._clock())
