"""Asynchronous training through the hub: the backend that places hubs and workers on engines
(`backend.py`), the worker loop (`worker.py`) and workers added mid-run (`elastic.py`)."""
