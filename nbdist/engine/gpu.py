"""An engine's GPU, as the node table shows it: name and memory once at hello, utilisation
and memory used every few seconds in a push header (never per push).

NVIDIA's management library is optional (`pip install nvidia-ml-py` on GPU nodes) and is
imported only when a worker starts. Without it, or without a device, every function here
returns nothing and the node table shows no GPU columns.
"""

from __future__ import annotations

import os
import time

__all__ = ["GPU_EVERY_S", "GpuMonitor", "device_for", "gpu_index", "probe", "use_device"]

GPU_EVERY_S = 5.0  # how often a worker reports its GPU's utilisation and memory used
_chosen: int | None = None  # the device (NVML index) this engine's TensorFlow was given


def gpu_index(local_rank: int, count: int) -> int | None:
    """Which of the `count` GPUs TensorFlow lists an engine of `local_rank` (its index among the
    run's engines on its host) trains on, or None without a GPU: its own while there are enough
    (local ranks 0..count-1 on GPUs 0..count-1), shared round-robin beyond that.

    Example:
        >>> [gpu_index(r, 2) for r in range(4)], gpu_index(0, 0)
        ([0, 1, 0, 1], None)
    """
    return local_rank % count if count > 0 else None


def device_for(local_rank: int, count: int, visible: str | None) -> int:
    """The NVML index of the GPU a worker of `local_rank` uses among `count` visible ones:
    TensorFlow lists the devices of CUDA_VISIBLE_DEVICES (`visible`) in that order, and the
    engine takes entry `local_rank % count` (nbdist.engine.keras_backend.configure_tensorflow).

    Example:
        >>> device_for(1, 2, "2,3"), device_for(3, 4, None), device_for(2, 2, "5,7")
        (3, 3, 5)
    """
    position = gpu_index(local_rank, count) or 0
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if not entries:
        return position
    entry = entries[position % len(entries)]
    return int(entry) if entry.isdigit() else position  # a UUID: NVML's order is the best guess


def use_device(local_rank: int, count: int) -> int:
    """Record the GPU this engine's TensorFlow uses, so the monitor reads that one."""
    global _chosen
    _chosen = device_for(local_rank, count, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return _chosen


def _device(nvml=None):
    """(nvml module, handle of this engine's GPU), or (None, None) when there is none."""
    if nvml is None:
        try:
            import pynvml as nvml  # optional: GPU nodes (the gpu extra)
        except ImportError:  # no nvidia-ml-py: a CPU node
            return None, None
    try:
        nvml.nvmlInit()
        if nvml.nvmlDeviceGetCount() < 1:
            return None, None
        index = (_chosen if _chosen is not None
                 else device_for(0, 1, os.environ.get("CUDA_VISIBLE_DEVICES")))
        return nvml, nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - NVMLError (no driver, no device): treated as no GPU
        return None, None


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def probe(nvml=None) -> dict | None:
    """{"gpu": name, "gpu_mem_total": bytes} of this engine's GPU, or None without one (no
    `pynvml`, no driver or no device).

    Example:
        >>> probe() is None or "gpu" in probe()
        True
    """
    return GpuMonitor(nvml=nvml).info() or None


class GpuMonitor:
    """A worker's GPU readings: `info()` for hello, `sample()` for a push header (empty
    unless `every_s` have passed since the last reading). Without a GPU both are empty."""

    def __init__(self, every_s: float = GPU_EVERY_S, nvml=None, clock=time.monotonic):
        self.every_s, self._clock = every_s, clock
        self._nvml, self._handle = _device(nvml)
        self._next = float("-inf")

    @property
    def present(self) -> bool:
        return self._handle is not None

    def info(self) -> dict:
        if not self.present:
            return {}
        return {"gpu": _text(self._nvml.nvmlDeviceGetName(self._handle)),
                "gpu_mem_total": int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)}

    def sample(self) -> dict:
        if not self.present:
            return {}
        now = self._clock()
        if now < self._next:
            return {}
        self._next = now + self.every_s
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used
        except Exception:  # noqa: BLE001 - a reading that fails is skipped, never fatal
            return {}
        return {"gpu_util": int(util), "gpu_mem": int(used)}
