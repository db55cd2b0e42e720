"""nbdist: distributed Keras training from a notebook cell.

    %load_ext nbdist
    %nbdist start 3
    %%distribute --workers 2 --epochs 2
    ...ordinary Keras code that builds and compiles `model`...

Everything the magics do is also plain Python: `nbdist.Cluster.start(3)`,
`nbdist.train(cell_source, cluster=cluster, workers=2)`, `nbdist.compare(run_a, run_b)`. Importing
nbdist is light: it loads no TensorFlow, Keras, Horovod or plotly until a run needs them.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING

from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.errors import NbdistError

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Cluster",
    "Mode",
    "NbdistError",
    "Rule",
    "Run",
    "TrainConfig",
    "compare",
    "load_ipython_extension",
    "resume",
    "sweep",
    "train",
    "unload_ipython_extension",
]

_LAZY = {"Cluster": "nbdist.cluster.engines", "Rule": "nbdist.algorithms.base",
         "Run": "nbdist.run.handle",
         "compare": "nbdist.dashboard.comparison", "resume": "nbdist.api", "train": "nbdist.api",
         "sweep": "nbdist.sweeps"}

if TYPE_CHECKING:
    from nbdist.api import resume, train
    from nbdist.cluster.engines import Cluster
    from nbdist.dashboard.comparison import compare
    from nbdist.run.handle import Run
    from nbdist.sweeps import sweep


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nbdist' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """`%load_ext nbdist`: registers %nbdist and %%distribute, and quiets TensorFlow's C++
    INFO lines (oneDNN, CPU features), which would otherwise fill the cell's output in red."""
    from nbdist.magic import NbdistMagics  # IPython: not at `import nbdist`

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

    ipython.register_magics(NbdistMagics(ipython))


def unload_ipython_extension(ipython) -> None:
    """`%unload_ext nbdist`: stops a cluster the magics started."""
    magics = ipython.magics_manager.registry.get("NbdistMagics")
    if magics is not None:
        magics.close()
