"""Per-worker traffic: bytes counted on the sockets (tests/inproc/test_send_frames.py), kept
by the coordinator, turned into bytes/s by the kernel."""

from nbdist.core.coordinator import Coordinator, Plan
from nbdist.core.stats import WorkerStats
from nbdist.core.traffic import TrafficRates
from nbdist.wire.messages import Hello, Report, Step


def test_node_row_splits_tcp_and_shared_memory_bytes():
    w = WorkerStats(worker=0)
    w.hello(Hello(0, link="tcp"))
    w.take(Step(0, traffic=[1000, 4000, 0, 0]))
    w.take(Step(0, traffic=[2000, 8000, 10, 20]))
    row = w.to_row()
    assert (row["link"], row["bytes_sent"], row["bytes_received"]) == ("tcp", 2010, 8020)
    assert (row["tcp_bytes"], row["shm_bytes"]) == (10_000, 30)
    assert "traffic" not in row


def test_a_step_without_totals_keeps_the_last_ones():
    w = WorkerStats(worker=0)
    w.take(Step(0, traffic=[5, 6, 0, 0]))
    w.take(Report(0, loss=0.5))  # a synchronous rank's report
    assert (w.to_row()["bytes_sent"], w.to_row()["bytes_received"]) == (5, 6)


def test_coordinator_shows_each_workers_link_and_latest_totals():
    c = Coordinator(Plan(num_workers=2, num_samples=8, epochs=1, batch_size=4, lr=0.1,
                         has_validation=False))
    (c.hello(Hello(0, host="a", engine=0, link="shm")),
     c.hello(Hello(1, host="b", engine=1, link="tcp")))
    chunk = c.work_for(1, pulled=True, version=0).chunks[0]
    c.push(Step(1, chunks=[chunk.id], loss=1.0, traffic=[300, 700, 0, 0]), delay=0, now=1.0)
    nodes = c.snapshot(since=0)["nodes"]
    assert ([(n["host"], n["link"], n["tcp_bytes"]) for n in nodes]
            == [("a", "shm", 0), ("b", "tcp", 1000)])


def test_rate_is_bytes_per_second_over_at_least_the_window():
    rates = TrafficRates(window_s=1.0)
    rates.update([{"worker": 0, "bytes_sent": 0, "bytes_received": 0}], now=10.0)
    early = [{"worker": 0, "bytes_sent": 100, "bytes_received": 100}]
    rates.update(early, now=10.5)  # under the window: no rate yet
    assert early[0]["bytes_per_s"] == 0.0
    late = [{"worker": 0, "bytes_sent": 3_000_000, "bytes_received": 1_000_000}]
    rates.update(late, now=12.0)
    assert late[0]["bytes_per_s"] == 2_000_000.0
    kept = [{"worker": 0, "bytes_sent": 3_000_000, "bytes_received": 1_000_000}]
    rates.update(kept, now=12.5)  # within the next window the last rate is shown
    assert kept[0]["bytes_per_s"] == 2_000_000.0
    idle = [{"worker": 0, "bytes_sent": 3_000_000, "bytes_received": 1_000_000}]
    rates.update(idle, now=13.0)  # a worker that stopped sending drops to zero
    assert idle[0]["bytes_per_s"] == 0.0


def test_a_restarted_worker_starts_a_new_window_instead_of_a_negative_rate():
    rates = TrafficRates(window_s=1.0)
    rates.update([{"worker": 3, "bytes_sent": 5000, "bytes_received": 0}], now=0.0)
    again = [{"worker": 3, "bytes_sent": 10, "bytes_received": 0}]
    rates.update(again, now=2.0)
    assert again[0]["bytes_per_s"] == 0.0
    later = [{"worker": 3, "bytes_sent": 1010, "bytes_received": 0}]
    rates.update(later, now=4.0)
    assert later[0]["bytes_per_s"] == 500.0
