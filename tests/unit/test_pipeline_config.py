"""TrainConfig's --mode pipeline options: defaults, and each refusal saying what to do."""

from __future__ import annotations

import pytest

from nbdist.config import Mode, TrainConfig
from nbdist.errors import ConfigError


def test_defaults_and_flags():
    c = TrainConfig(mode="pipeline", stages=3, micro_batches=8, batch_size=64, partition="greedy",
                    schedule="1f1b")
    assert c.mode is Mode.PIPELINE and (c.stages, c.micro_batches, c.partition, c.schedule) == (
        3, 8, "greedy", "1f1b")
    d = TrainConfig(mode="pipeline")
    assert (d.stages, d.micro_batches, d.partition, d.schedule) == (2, 4, "measured", "gpipe")
    assert d.to_dict()["stages"] == 2


@pytest.mark.parametrize(("options", "message"), [
    (dict(stages=0), r"--stages must be a whole number >= 1 \(Received: 0\)"),
    (dict(micro_batches=True), r"--micro-batches must be a whole number"),
    (dict(partition="best"),
     r"--partition must be one of measured, optimal, greedy, uniform, random \(Received: 'best'\)"),
    (dict(schedule="pipedream"),
     r"--schedule must be one of gpipe, 1f1b \(Received: 'pipedream'\)"),
    (dict(batch_size=30, micro_batches=4),
     r"--batch-size 30 does not split into --micro-batches 4 .*e\.g\. 28"),
    (dict(algorithm="dc-asgd"), r"--algorithm does not apply to --mode pipeline, which cuts the "
     r"model into stages.*\(Received: --algorithm dc-asgd\). --algorithm works with --mode "
     r"async, local, simulate. Drop the flag, or pick one of those modes."),
    (dict(servers=2, overlap=True), r"--servers and --overlap do not apply .*Received: --servers "
     r"2, --overlap\). --servers and --overlap work with --mode async, local. Drop them"),
    (dict(workers=2), r"--workers does not apply"),
    (dict(pause_at=0), r"--pause-at does not apply"),  # a pipeline has no pause
    (dict(checkpoint_dir="ckpt"), r"--checkpoint-dir does not apply"),
])
def test_refusals(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(mode="pipeline", **options)


def test_other_modes_ignore_the_pipeline_fields():
    # not checked outside pipeline
    assert TrainConfig(mode="async", batch_size=30).micro_batches == 4


def test_stages_share_the_cores_their_host_s_engines_report():
    from nbdist.cluster.netaddr import HostNet
    from nbdist.modes.pipeline.placement import stage_threads

    nets = {0: HostNet("a", "a:b", "10.0.0.1", cores=(0, 1, 2, 3)),
            1: HostNet("a", "a:b", "10.0.0.1", cores=(0, 1, 2, 3)),
            2: HostNet("b", "b:b", "10.0.0.2", cores=(0, 1, 2, 3, 4, 5, 6, 7)),
            3: HostNet("c", "c:b", "10.0.0.3", cores=(0,))}
    assert stage_threads(nets, [0, 1, 2, 3]) == [2, 2, 8, 1]
    assert stage_threads(nets, [2]) == [8]
