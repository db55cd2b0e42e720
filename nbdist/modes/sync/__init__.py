"""Synchronous training with Horovod: each worker a rank that allreduces its gradient and applies
the cell's own optimizer (`backend.py`), sync BatchNorm (`batchnorm.py`)."""
