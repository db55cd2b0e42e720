"""The vocabulary of nbdist's sockets, at the bottom of the package: every message a typed
dataclass (`messages.py`, with the `Chunk` of an epoch that replies carry), and the schema that
checks a received header and writes a sent one from those annotations (`schema.py`).

Why at the bottom: the pure core builds and reads these messages (`nbdist.core.shard` answers a
`Step` with a `Reply`), and so do the hub, the checkpoints, the workers and the simulator. So
the vocabulary imports nothing of nbdist's but `nbdist.errors`, and everything that speaks it
imports it downwards. Framing, signing and sockets are the hub's edge (`nbdist.hub.protocol`,
`nbdist.hub.wire`), above the core.
"""
