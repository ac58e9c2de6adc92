"""Whether this process holds the job's secret (``check_job_secret``).

On etcd the store does not know the job's secret: a process with another one reads and
writes the store as well as any, and only fails later, where peers prove the secret to
each other (the ring's handshakes, the ps shards' calls), which refuse it in silence by
design (a refused peer learns nothing). So it would wait, say nothing, and time out. The
leader writes a fingerprint of the secret in its persisted state
(``DriverStateRecord.secret_id``, ``rendezvous.net.auth.secret_fingerprint``): comparing
it at the start turns that into one line naming the variable.
"""

from __future__ import annotations

from rendezvous.env import ENV_SECRET
from rendezvous.errors import RendezvousAuthError
from rendezvous.keys import JobKeys
from rendezvous.net.auth import secret_fingerprint
from rendezvous.schema.leader import DriverStateRecord
from rendezvous.store import KVStore


def check_job_secret(store: KVStore, keys: JobKeys, secret: str) -> None:
    """Nothing when the job's leader wrote no fingerprint yet (no job yet, or an older
    leader), or when it is that of ``secret``.

    Raises:
        RendezvousAuthError: the job's leader holds another secret (one line naming
            ``ELASTIC_JOB_SECRET`` and the job).
        RendezvousError: the store cannot be read.
    """
    # Read unchecked: with another secret, every record's signature looks forged (and
    # ``store.get`` would ignore it); the fingerprint turns that into its cause.
    value = store.get_unchecked(keys.driver_state)
    if value is None:
        return
    try:
        expected = DriverStateRecord.from_json(value).secret_id
    except (ValueError, TypeError):
        return  # unreadable: the leader's business, not a verdict on our secret
    if expected and expected != secret_fingerprint(secret):
        raise RendezvousAuthError(
            f"{ENV_SECRET} is not the secret job {keys.job_id!r} runs with (its fingerprint "
            f"{secret_fingerprint(secret)}, the job's {expected}): give every process of "
            "the job the same secret"
        )
