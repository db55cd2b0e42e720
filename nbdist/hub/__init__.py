"""The parameter server's edges: framing, the socket server, shared memory, the client.

A hub shard (`server.py`) is a socket loop around the pure shard logic in `nbdist.core`; workers
and the kernel reach it through `client.py`. The messages are typed in `nbdist.wire`; every one
is framed and signed by `protocol.py` and received through `wire.py`'s bounded, checked receive.
"""
