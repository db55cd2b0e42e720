"""Asynchronous training through the hub (`--mode async`): its start (`start.py`), the backend
that places hubs and workers on engines (`backend.py`), the worker loop (`worker.py`, also the
worker of `--mode local`) and workers added mid-run (`elastic.py`)."""
