"""Checkpoints, the kernel's store: files written atomically and checked on load (`store.py`),
one run per folder (`folder.py`) and a sync run's state on its ranks and in the kernel
(`sync_state.py`). What a hub shard sends for one is the hub's (`nbdist.hub.export`). Nothing in
them is executed."""
