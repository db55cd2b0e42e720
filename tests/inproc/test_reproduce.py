"""benchmarks/reproduce.py --quick end to end: simulated runs, the report, its figures."""

import json
import os
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three simulated Fashion-MNIST runs, ~30 s

REPO = Path(__file__).resolve().parents[2]


def test_reproduce_quick_writes_the_table_the_claims_and_the_figures(tmp_path):
    pytest.importorskip("nbdist.datasets").load_fashion_mnist()  # skip cleanly if data absent
    out = tmp_path / "reproduce.md"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "reproduce.py"), "--quick", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "--quick --out" in report  # the command that regenerates it
    assert "| sync | 0.3 |" in report and "| ddc-asgd | 0.3 |" in report
    assert "DDC-ASGD beats ASGD (seed 000), acc@T: **" in report  # a verdict, whichever it is
    xml.dom.minidom.parse(str(tmp_path / "reproduce-1124.svg"))  # a well-formed figure
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["algo"] for r in rows] == ["sync", "asgd", "ddc-asgd"]
    sync = rows[0]
    if not sync["diverged"]:
        assert sync["delay_mean"] == 0 and sync["end_time"] > sync["T"]
