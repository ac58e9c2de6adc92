"""The store's backends, each a ``KVStore`` (``rendezvous.store``) implementing one
attempt of each operation: ``embedded`` (a gRPC client, and the server the driver runs,
over ``memory``'s in-memory store) and ``etcd`` (an etcd v3 cluster). They register by
URL scheme in ``rendezvous.BACKENDS`` and are imported only when chosen.
"""
