"""`--mode local`: the hub shards and one worker as threads of this kernel (`backend.py`),
started by `start.py`; the worker is the hub's worker (nbdist.modes.common.worker) on the
arrays the kernel already holds. For trying a cell without a cluster."""
