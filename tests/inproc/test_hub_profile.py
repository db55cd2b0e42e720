"""The hub's per-phase CPU profile (HubSpec.profile): counted per push, every phase charged,
and nothing counted when it is off."""

import threading

import numpy as np

from nbdist.core.coordinator import Plan
from nbdist.hub.client import WorkerTransport
from nbdist.hub.control import HubControl
from nbdist.hub.profile import PHASES
from nbdist.hub.protocol import new_key
from nbdist.hub.server import Hub, HubSpec
from nbdist.wire.messages import Step


def _serve_pushes(profile: bool, transport: str, pushes: int = 20) -> dict:
    key = new_key()
    plan = Plan(num_workers=1, num_samples=10**6, epochs=1, batch_size=10, lr=0.1,
                has_validation=False)
    hub = Hub(HubSpec("prof", key, 0, 1, plan, np.ones(5000, np.float32), np.zeros(0, np.float32),
                      profile=profile))
    result = {}
    thread = threading.Thread(target=lambda: result.update(hub.serve()), daemon=True)
    thread.start()
    tr = WorkerTransport(key, 0, [hub.endpoints], 0, transport, timeout=30)
    try:
        reply = tr.hello()
        for _ in range(pushes):
            chunk = reply.chunks[0].id
            reply = tr.step(Step(0, push=True, pull=True, chunks=[chunk], loss=0.0, compute_s=0.01))
        tr.bye()
    finally:
        tr.close()
        control = HubControl(key, [hub.endpoints], name="test-stop")
        control.shutdown()
        control.close()
        thread.join(10)
    return result


def test_a_profiled_hub_charges_every_phase_of_each_push_and_counts_the_pushes():
    for transport in ("auto", "tcp"):
        profile = _serve_pushes(True, transport)["profile"]
        assert profile["pushes"] == 20
        assert set(profile) == {"pushes", "clock", *PHASES} and profile["clock"] > 0
        # every phase of a push runs code, so each gets CPU time (the thread clock has ns steps)
        assert all(profile[p] > 0 for p in PHASES if p != "loop"), profile


def test_an_unprofiled_hub_reports_no_profile():
    assert "profile" not in _serve_pushes(False, "auto", pushes=2)
