"""The engine-side GPU probe: nothing without pynvml or a device; readings rate-limited."""

import importlib.util
from types import SimpleNamespace

import pytest

from nbdist.engine.gpu import GpuMonitor, probe


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here")
def test_probe_finds_no_gpu_without_pynvml():
    assert probe() is None
    monitor = GpuMonitor()
    assert (monitor.present, monitor.info(), monitor.sample()) == (False, {}, {})


class FakeNvml:
    """A library object with NVML's calls (no process is faked: the monitor takes the module)."""

    def __init__(self, count=1):
        self.count, self.util = count, 40

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"gpu{i}"

    def nvmlDeviceGetName(self, handle):
        return b"Tesla T4"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=16 * 2**30, used=3 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.util)


def test_a_library_without_devices_counts_as_no_gpu():
    assert probe(FakeNvml(count=0)) is None


def test_hello_names_the_gpu_and_its_memory():
    assert probe(FakeNvml()) == {"gpu": "Tesla T4", "gpu_mem_total": 16 * 2**30}


def test_utilisation_is_read_at_most_every_few_seconds():
    now = [100.0]
    nvml = FakeNvml()
    monitor = GpuMonitor(every_s=5.0, nvml=nvml, clock=lambda: now[0])
    assert monitor.sample() == {"gpu_util": 40, "gpu_mem": 3 * 2**30}
    nvml.util = 90
    now[0] = 104.0
    assert monitor.sample() == {}  # within 5 s of the last reading: nothing in this push
    now[0] = 105.0
    assert monitor.sample()["gpu_util"] == 90


def test_the_monitor_reads_the_gpu_tensorflow_was_given(monkeypatch):
    from nbdist.engine import gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setattr(gpu, "_chosen", None)
    assert gpu.use_device(local_rank=3, count=2) == 6  # TensorFlow's gpus[3 % 2] is device 6
    seen = []

    class Recording(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, i):
            seen.append(i)
            return super().nvmlDeviceGetHandleByIndex(i)

    GpuMonitor(nvml=Recording(count=8))
    assert seen == [6]
