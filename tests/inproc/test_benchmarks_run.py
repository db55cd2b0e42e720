"""Every benchmark starts: its imports resolve and its options parse (`--help`), so a rename in
nbdist cannot leave a benchmark broken until someone runs `make bench`."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted(p for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py")
                    if not p.name.startswith("_"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_imports_and_parses_its_options(script):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=script.parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
