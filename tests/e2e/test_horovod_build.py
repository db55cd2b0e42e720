"""Checks of the Horovod build made by `make horovod` (scripts/build_horovod.sh).

Each test runs Horovod in fresh subprocesses of this interpreter, so a broken build (e.g. an
extension linked against another TensorFlow) fails here instead of crashing the pytest process.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = [
    pytest.mark.horovod,
    pytest.mark.skipif(
        importlib.util.find_spec("horovod") is None,
        reason="horovod is not installed in this Python; build it with `make horovod` "
        "(scripts/build_horovod.sh)",
    ),
]


def _clean_env():
    """The environment minus any HOROVOD_* settings from an enclosing job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _fail_with_output(what, proc):
    pytest.fail(
        f"{what} exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}"
        f"\n--- stderr ---\n{proc.stderr[-4000:]}"
    )


def test_single_process_init():
    code = (
        "import json, horovod.tensorflow as hvd; hvd.init(); "
        "print(json.dumps({'size': hvd.size(), 'rank': hvd.rank(), 'gloo': hvd.gloo_built()}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_clean_env()
    )
    if proc.returncode != 0:
        _fail_with_output("hvd.init() in a single process", proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"size": 1, "rank": 0, "gloo": True}


# Rank r contributes r-dependent values, so a collective that silently did nothing is caught.
WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    import keras
    import horovod.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    out = {"rank": r, "size": hvd.size()}
    out["mean"] = hvd.allreduce(tf.constant([r + 1.0, 10.0 * (r + 1)]),
                                op=hvd.Average).numpy().tolist()
    v = keras.Variable(np.full((2, 3), 100.0 + r, dtype="float32"), name="w")
    grouped = hvd.grouped_allreduce([tf.constant([float(r)]), v.value], op=hvd.Average)
    out["grouped"] = [t.numpy().tolist() for t in grouped]
    out["before"] = v.numpy().tolist()
    v.assign(hvd.broadcast(v.value, root_rank=0))
    out["after"] = v.numpy().tolist()
    with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
        json.dump(out, f)
    """
)


@pytest.mark.slow
def test_two_process_gloo_allreduce_and_broadcast(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # horovodrun via -m so it runs under this interpreter. With only localhost in -H it needs no
    # ssh and Gloo talks over the 127.0.0.1 interface (its short-lived rendezvous HTTP server
    # binds all interfaces, though). --disable-cache keeps it from writing to ~/.horovod.
    cmd = [
        sys.executable, "-m", "horovod.runner.launch",
        "-np", "2", "-H", "localhost:2", "--gloo", "--disable-cache", "--start-timeout", "60",
        sys.executable, str(script), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_clean_env())
    if proc.returncode != 0:
        _fail_with_output("horovodrun -np 2 --gloo", proc)

    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, res in enumerate(results):
        assert (res["rank"], res["size"]) == (r, 2)
        np.testing.assert_allclose(res["mean"], [1.5, 15.0])  # mean of [1, 10] and [2, 20]
        np.testing.assert_allclose(res["grouped"][0], [0.5])
        np.testing.assert_allclose(res["grouped"][1], np.full((2, 3), 100.5))
        np.testing.assert_array_equal(res["before"], np.full((2, 3), 100.0 + r))
        np.testing.assert_array_equal(res["after"], np.full((2, 3), 100.0))  # rank 0's value


def test_the_build_carries_nbdists_patch_mark_and_its_key():
    """`make horovod` patches the process-set Gloo set-up (HOROVOD_GLOO_IFACE honoured) and
    marks the build; an unmarked Horovod here means a wheel built before that patch."""
    from pathlib import Path

    from nbdist.modes.sync.network import horovod_build, iface_honoured

    build = horovod_build()
    assert iface_honoured(build), (f"Horovod here is not nbdist's patched build (mark {build!r}): "
                                   "run `make horovod`")
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_horovod.sh"
    plan = subprocess.run(["bash", str(script), "--plan", sys.executable], capture_output=True,
                          text=True, timeout=120,
                          env={**_clean_env(), "NBDIST_HOROVOD_OPS": build.split("-")[1]})
    assert plan.returncode == 0, plan.stderr
    assert f"-nbdist{build}-" in plan.stdout  # the key of this build: a rerun has nothing to do
