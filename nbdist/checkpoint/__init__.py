"""Checkpoints: files written atomically by the kernel (`store.py`), a shard's own part
(`shard_state.py`) and a sync run's state (`sync_state.py`). Nothing in them is executed."""
