"""The ipyparallel cluster: the engines and their roles (`engines.py`), which address each host
binds and reaches (`netaddr.py`), and the watchdog that ends engines when the kernel dies."""

from nbdist.cluster.engines import Cluster

__all__ = ["Cluster"]
