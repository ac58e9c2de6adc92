"""Environment variables by which the driver tells workers and shards about their job."""
from rendezvous.auth import ENV_SECRET  # noqa: F401  (re-exported: one place for env names)

ENV_RENDEZVOUS = "ELASTIC_RENDEZVOUS"      # store URL: embedded address or etcd://...
ENV_JOB_ID = "ELASTIC_JOB_ID"
ENV_WORKER_ID = "ELASTIC_WORKER_ID"        # unique per launched worker process
ENV_HOST = "ELASTIC_HOST"                  # the host name the driver knows this worker by
ENV_SLOT = "ELASTIC_SLOT"
ENV_BIND_HOST = "ELASTIC_BIND_HOST"        # address the worker's data listener binds to
