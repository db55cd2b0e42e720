"""Asynchronous training through the hub (`--mode async`): its start (`start.py`) and the
backend that places hub shards and workers on a cluster's engines (`backend.py`). The worker
loop it sends to the engines is the shared one (nbdist/modes/common/worker.py), and workers
added mid-run go through the Run (nbdist/run/elastic.py)."""
