"""The job's store as its leader uses it: every write fenced on this driver's lead
(``driver.leadership.claim``: a driver that lost the lead writes nothing more), and reads
that log a failure instead of raising, for what the loop only looks up.

``FencedStore`` works over the store session (``driver.job.session``): the claim and
the store exist once it is open.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from driver.job.session import StoreSession
from rendezvous.errors import RendezvousError
from rendezvous.keys import JobKeys
from rendezvous.store import Delete, Put

log = logging.getLogger(__name__)


class FencedStore:
    """Fenced writes and quiet reads of the job's store (``session``'s, once open)."""

    def __init__(self, session: StoreSession):
        self._session = session

    @property
    def keys(self) -> JobKeys:
        """The job's key layout."""
        return self._session.keys

    def term(self) -> int:
        """The term of this driver's lead, stamped on the rounds it publishes.

        Raises:
            JobFailed: the store is not open.
        """
        return self._session.claim.record.term

    def check(self) -> None:
        """Go on only while this driver leads the job (``DriverClaim.check``).

        Raises:
            LeadershipLost: another driver leads.
            JobFailed: the store is not open.
        """
        self._session.claim.check()

    def steer(self, ops: Sequence[Put | Delete]) -> int:
        """Write ``ops`` fenced on this driver's lead (``DriverClaim.steer``).

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        return self._session.claim.steer(ops)

    def steer_unless(self, key: str, ops: Sequence[Put | Delete]) -> int | None:
        """``steer`` while ``key`` does not exist; None (nothing written) when it does.

        Raises:
            LeadershipLost: another driver leads.
            RendezvousError: the store cannot be used.
        """
        return self._session.claim.steer_unless(key, ops)

    def delete_quietly(self, key: str) -> None:
        """Delete ``key`` (a prefix when it ends in ``/``), fenced on the lead; a failure
        of the store is only logged.

        Raises:
            LeadershipLost: another driver leads.
        """
        try:
            self.steer([Delete(key, prefix=key.endswith("/"))])
        except RendezvousError as exc:
            log.debug("could not delete %s: %s", key, exc)

    def has_key(self, key: str) -> bool:
        """Whether ``key`` exists (False when the store cannot say: a failure is logged)."""
        return self.value(key) is not None

    def value(self, key: str) -> bytes | None:
        """What ``key`` holds (None when it does not exist, or when the store cannot
        say: a failure is logged)."""
        try:
            kv = self._session.require_store().get(key)
        except RendezvousError as exc:
            log.warning("could not read %s: %s", key, exc)
            return None
        return kv.value if kv is not None else None
