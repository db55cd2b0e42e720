"""What the modes share, below them: it imports no mode package, and no mode package imports
another (tests/unit/test_layering.py checks both).

- `launch.py`: start the hub shards and the workers from a `Job`, and hand the running job
  to a `Run` (`Run.begin`);
- `worker.py` (with `courier.py`): the worker that pulls from and pushes to the hub, on an
  engine (`--mode async`) or in this kernel (`--mode local`); its `WorkerSpec` is also the
  base of a sync rank's spec;
- `engine_backend.py`: placing hubs and workers on a cluster's engines and watching their
  tasks (the base of the async and sync backends);
- `kernel_hub.py`: hub shards as threads of this kernel (local mode's, sync's metrics hub).
"""
