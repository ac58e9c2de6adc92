"""How the job's processes find and trust each other: the addresses a machine
advertises and whether a host is this machine (``addresses``), ``HOST:PORT`` and store
URLs (``url``), the job secret and its proofs (``auth``), and the raw-bytes gRPC calls
every server of the job checks them on (``rpc``).
"""
