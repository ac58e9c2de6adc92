"""The store's three backends. Two are a ``KVStore`` (``rendezvous.store``) implementing
one attempt of each operation, registered by URL scheme in ``rendezvous.BACKENDS`` and
imported only when chosen: ``embedded`` (a gRPC client, and the server the driver runs)
and ``etcd`` (an etcd v3 cluster). The third, ``memory``, is the embedded server's
state: an in-memory etcd v3 model, with no URL of its own.
"""
