"""Synchronous training with Horovod (`--mode sync`): its start (`start.py`), the kernel side
that sets up the rendezvous and the ranks (`backend.py`), one rank's loop that allreduces its
gradient and applies the cell's own optimizer (`rank.py`), sync BatchNorm (`batchnorm.py`)."""
