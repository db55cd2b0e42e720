"""The simulated network's arithmetic (`nbdist.core.links`) and its `--sim` options: each
message's arrival worked out by hand."""

import math

import pytest

from nbdist.config import TrainConfig
from nbdist.core.links import HUB, Link, Network, ring_allgather_s, ring_allreduce_s
from nbdist.core.simclock import SimOptions, parse_sim, sim_options
from nbdist.errors import ConfigError

MBIT = 1e6


def lab(n: int, mbit: float = 8.0, ms: float = 1.0) -> Network:
    """The hub and n workers, every link at `mbit` (8 Mbit/s: a byte per microsecond)."""
    return Network({h: Link(mbit * MBIT, ms * 1e-3) for h in [HUB, *map(str, range(n))]})


def test_a_message_takes_its_bytes_over_the_rate_then_both_links_delays():
    # 8 Mbit/s: 4,000 bytes take 4 ms on the wire; then 1 ms on each of the two links
    assert lab(1).send(10.0, "0", HUB, 4000) == pytest.approx(10.006, abs=1e-12)


def test_pushes_sent_at_once_queue_at_the_hubs_downlink_first_come_first_served():
    net = lab(3)
    arrivals = [net.send(0.0, str(w), HUB, 1000) for w in range(3)]
    # each holds the hub's downlink for 1 ms after the one before; each arrives 2 ms after it
    assert arrivals == pytest.approx([0.003, 0.004, 0.005], abs=1e-12)
    # the hub's uplink is free: its pull to worker 0 leaves at once
    assert net.send(0.0, HUB, "0", 1000) == pytest.approx(0.003, abs=1e-12)
    # worker 0's uplink is free again at 1 ms: its next push waits for the downlink (3 ms)
    assert net.send(0.002, "0", HUB, 1000) == pytest.approx(0.006, abs=1e-12)


def test_the_slower_link_of_the_two_sets_the_pace_and_one_host_crosses_none():
    net = Network({HUB: Link(80 * MBIT, 0.0), "0": Link(8 * MBIT, 5e-3)})
    assert net.send(1.0, HUB, "0", 8000) == pytest.approx(1.0 + 0.008 + 0.005, abs=1e-12)
    assert net.send(1.0, "0", "0", 10**9) == 1.0
    unlimited = Network({HUB: Link(), "0": Link()})
    assert unlimited.send(2.5, "0", HUB, 10**9) == 2.5


def test_a_ring_allreduce_takes_two_m_minus_one_rounds_of_a_mth_of_the_buffer():
    # 4 hosts at 8 Mbit/s and 1 ms: a round is 1,000 of 4,000 bytes (1 ms) plus 2 ms of delay
    assert ring_allreduce_s(4000, [Link(8 * MBIT, 1e-3)] * 4) == pytest.approx(6 * 0.003)
    # one slow host slows every round: 1,000 bytes at 1 Mbit/s take 8 ms
    links = [Link(8 * MBIT, 1e-3)] * 3 + [Link(1 * MBIT, 1e-3)]
    assert ring_allreduce_s(4000, links) == pytest.approx(6 * (0.008 + 0.002))
    assert ring_allreduce_s(4000, [Link(8 * MBIT, 1e-3)]) == 0.0  # one rank: nothing to send


def test_sim_links_parse_for_every_host_and_for_one():
    options = sim_options(parse_sim("bandwidth=1000,latency=0.2,bandwidth.hub=10000,latency.1=5"))
    assert options.has_links and not SimOptions().has_links
    links = options.links(2)
    assert links == {HUB: Link(1e10, 2e-4), "0": Link(1e9, 2e-4), "1": Link(1e9, 5e-3)}
    assert sim_options(parse_sim("latency=1")).links(1)["0"] == Link(math.inf, 1e-3)
    with pytest.raises(ConfigError, match=r"host\(s\) 2, but the run has virtual workers 0..1"):
        sim_options(parse_sim("bandwidth.2=10")).links(2)
    with pytest.raises(ConfigError, match="bandwidth.HOST and latency.HOST"):
        parse_sim("bandwidth.switch=10")
    with pytest.raises(ConfigError, match=r"--sim latency must be in \[0, 10000\]"):
        parse_sim("latency=-1")


def test_a_ring_allgather_passes_each_hosts_whole_frame_m_minus_1_times():
    # 3 hosts at 8 Mbit/s (a byte a microsecond) and 1 ms: 2 rounds of 1,000 bytes, 1 ms on
    # the wire and 2 ms of delay each; the slowest pair sets a round's pace
    links = [Link(8 * MBIT, 1e-3)] * 3
    assert ring_allgather_s(1000, links) == pytest.approx(2 * (0.001 + 0.002), abs=1e-12)
    slow = [Link(8 * MBIT, 1e-3), Link(4 * MBIT, 1e-3), Link(8 * MBIT, 1e-3)]
    assert ring_allgather_s(1000, slow) == pytest.approx(2 * (0.002 + 0.002), abs=1e-12)
    assert ring_allgather_s(1000, links[:1]) == 0.0
    # against the allreduce of the float32 buffer (4 bytes a float): a frame of under 2 / M of
    # it moves fewer bytes, as nbdist.core.gathered says
    assert ring_allgather_s(600, links) < ring_allreduce_s(4000, links)


def test_simulated_sync_takes_every_codec_but_powersgd():
    for codec in ("fp16", "int8", "qsgd:16", "topk:0.1", "randomk:0.1"):
        TrainConfig(mode="simulate", workers=2, sim="sync=1", compression=codec)
    with pytest.raises(ConfigError, match="but not --compression powersgd:2's two allreduces"):
        TrainConfig(mode="simulate", workers=2, sim="sync=1", compression="powersgd:2")
    TrainConfig(mode="simulate", workers=2, compression="powersgd:2")  # async: any codec
