"""The engine-side GPU probe: nothing without pynvml or a device; readings rate-limited."""

import importlib.util
from types import SimpleNamespace

import pytest

from nbdist.engine.gpu import GpuMonitor, probe


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None,
                    reason="pynvml is installed here")
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


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_engines_on_one_host_each_train_on_their_own_gpu_while_there_are_enough(gpus):
    from nbdist.engine.gpu import gpu_index

    assert [gpu_index(r, gpus) for r in range(gpus)] == list(range(gpus))
    # then shared in turn
    assert [gpu_index(r, gpus) for r in range(gpus, 2 * gpus)] == list(range(gpus))


def test_without_a_gpu_no_device_is_chosen():
    from nbdist.engine.gpu import gpu_index

    assert gpu_index(0, 0) is None and gpu_index(3, 0) is None


def test_the_monitor_and_tensorflow_agree_on_the_device_by_local_rank():
    """TensorFlow takes entry gpu_index(r, n) of the GPUs it lists (CUDA_VISIBLE_DEVICES order);
    the NVML index the monitor reads is that entry of CUDA_VISIBLE_DEVICES."""
    from nbdist.engine.gpu import device_for, gpu_index

    visible = "3,5,7"
    for r in range(6):
        assert device_for(r, 3, visible) == [3, 5, 7][gpu_index(r, 3)]
        assert device_for(r, 3, None) == gpu_index(r, 3)


def test_pipeline_stages_count_their_local_rank_per_host():
    from types import SimpleNamespace

    from nbdist.modes.pipeline.placement import local_ranks

    nets = {e: SimpleNamespace(hostname=h) for e, h in enumerate(["gpu1", "gpu2", "gpu1", "gpu1"])}
    assert local_ranks(nets, [0, 1, 2, 3]) == [0, 0, 1, 2]
    assert local_ranks(nets, [2, 0]) == [0, 1]  # the run's stages only, in stage order
    assert local_ranks(None, [0, 1, 2]) == [0, 1, 2]  # threads of this kernel: one host
