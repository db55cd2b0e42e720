"""nbdist.sweep on a real cluster: one cell over a grid of codecs, the table's bytes to the
target counted at the workers' sockets over TCP, and the speed-up against one worker."""

import nbdist
from tests.cluster.test_compression import WIDE_CELL


def test_a_sweep_over_codecs_gives_the_table_with_int8_at_under_30_percent_of_the_bytes(
        cluster):
    result = nbdist.sweep(WIDE_CELL, {"compression": ["none", "int8"]}, target=0.6,
                          cluster=cluster, workers=2, epochs=2, batch_size=16, transport="tcp",
                          progress=False)
    print(result.table.to_string())
    table = result.table.set_index("point")
    assert list(table.index) == ["compression=none", "compression=int8", "one worker (baseline)"]
    assert (result.runs["status"] == "finished").all()
    assert (table["reached"] == 1).all()
    none, int8 = table.loc["compression=none"], table.loc["compression=int8"]
    assert int8.bytes_to_target <= 0.30 * none.bytes_to_target
    assert none.bytes_source == int8.bytes_source == "counted"
    assert none.speedup > 0 and none.efficiency == none.speedup / 2
