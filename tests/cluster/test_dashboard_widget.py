"""The live dashboard's controls act on a real run on a real cluster (the widgets fed by hand
are tested in tests/inproc/test_dashboard_widget_fed.py)."""

import pytest

import nbdist
from nbdist.dashboard.figures import CONTROL_EVENTS
from nbdist.dashboard.widget import Dashboard
from tests.helpers import SYNTHETIC_CELL, wait_for

pytest.importorskip("ipywidgets")


def legend(fig: dict) -> set:
    return {t["name"] for t in fig["data"] if t.get("showlegend", True)}


def test_dashboard_controls_act_on_a_real_run(cluster):
    run = nbdist.train(SYNTHETIC_CELL, cluster=cluster, namespace={}, workers=2, epochs=300, batch_size=8)
    with run:
        dash = Dashboard(run)
        wait_for(lambda: "worker" in run.timeline and run.timeline["worker"].nunique() == 2, 60)
        dash.refresh()
        assert legend(dash.figures["throughput"]) == {"worker 0", "worker 1"}
        assert dash.table.value.count('class="nbdist-node"') == 2

        dash.pause_button.click()
        wait_for(lambda: run.status == "paused")
        dash.refresh()
        assert 'data-status="paused"' in dash.status.value and dash.pause_button.description == "Resume"

        dash.lr_slider.value = 0.02
        dash.slowdown_sliders[1].value = 3.0
        dash.policy.value = "dbs"
        wait_for(lambda: run.lr == pytest.approx(0.02)
                  and run.nodes["slowdown"].tolist() == [1.0, 3.0]
                  and run.stats.get("batch_policy") == "dbs")
        dash.pause_button.click()
        wait_for(lambda: run.status == "running")
        dash.stop_button.click()
        run.wait(timeout=60)
    assert run.status == "stopped"
    dash.step()  # the refresh after the end: the last redraw, controls off
    assert dash.stop_button.disabled and dash.lr_slider.disabled
    assert 'data-status="stopped"' in dash.status.value  # set after the run's last poll
    kinds = [e for e in run.events["event"] if e in CONTROL_EVENTS]
    assert kinds[:2] == ["pause", "set_lr"] and kinds[-2:] == ["resume", "stop"]
    assert {"set_slowdown", "set_batch_policy"} <= set(kinds)
    assert "lr=0.02" in str(dash.figures["throughput"]["layout"]["annotations"])
