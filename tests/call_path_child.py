"""The calls from `nbdist.train` to the first push the hub applies, traced in a fresh process
(so every lazy import happens inside the trace, as in a notebook's first run):

    python -m tests.call_path_child

A tracer (`sys.settrace` for this thread, `threading.settrace` for the threads the run starts)
sees every call of a function of an nbdist module and records it with its caller's nbdist
module: the nearest nbdist frame above it, even when third-party code sits between (a Keras
callback, an import hook). It records this thread until `nbdist.train` returns, the run's
threads until the first `ShardCore.push` is called. For a call that goes up the layers it
records whether the callee was reached through a value its caller holds (a callback, an
injected clock, a `Backend` it was given) rather than by name.

It prints one line `@@result {json}`: the calls (each distinct one once), the modules each
thread reached in order, and the hub's stack at the push.
"""

from __future__ import annotations

import json
import sys
import threading

RESULT = "@@result "
# a run of the smallest cell that trains: 64 samples of 8 features, one step before the push
CELL = '''
import keras
from nbdist.datasets import make_synthetic
(x_train, y_train), (x_test, y_test) = make_synthetic(n=80, shape=(8,), classes=3, seed=1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
'''
FIRST_PUSH = ("nbdist.core.shard", "ShardCore.push")
WORKER, HUB = "nbdist-local-worker", "nbdist-hub-0"  # the threads `--mode local` starts


def _nbdist(frame) -> str | None:
    name = frame.f_globals.get("__name__") or ""
    return name if name == "nbdist" or name.startswith("nbdist.") else None


def _nearest(frame):
    """The nearest frame of an nbdist module from `frame` up, or None."""
    while frame is not None and _nbdist(frame) is None:
        frame = frame.f_back
    return frame


def _importing(frame) -> bool:
    """Whether an nbdist module's body runs at or above `frame` (an import, not the path)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and _nbdist(frame):
            return True
        frame = frame.f_back
    return False


def _holds(frame, code, depth: int = 3) -> bool:
    """Whether `frame` reaches a function with `code` through the values it holds: its locals,
    and their attributes, items and classes' methods, `depth` steps deep."""
    seen, layer = set(), list(frame.f_locals.values())
    for _ in range(depth):
        after = []
        for value in layer:
            if id(value) in seen or isinstance(value, (str, bytes, int, float, type(None))):
                continue
            seen.add(id(value))
            try:
                if getattr(getattr(value, "__func__", value), "__code__", None) is code:
                    return True
                after.extend(_inside(value))
            except Exception:  # noqa: BLE001, S112 - a value that resists looking (autograph's)
                continue
        layer = after
    return False


def _inside(value) -> list:
    """What `value` holds: a container's items, an object's attributes and its class's
    functions."""
    if isinstance(value, (list, tuple, set)):
        return list(value)
    if isinstance(value, dict):
        return list(value.values())
    methods = [v for cls in type(value).__mro__ for v in vars(cls).values()
               if hasattr(v, "__code__")]
    return methods + list(getattr(value, "__dict__", {}).values())


class Tracer:
    def __init__(self):
        self.main = threading.main_thread()
        self.pushed = threading.Event()
        self.calls: dict[tuple, None] = {}  # (thread, caller, callee, qualname, body, held)
        self.order: dict[str, list[str]] = {}  # thread -> the modules it reached, in order
        self.hub_stack: list[str] = []
        self._held: dict[tuple, bool] = {}
        self.errors: list[str] = []

    def __call__(self, frame, event, arg):
        if event != "call":
            return None
        try:
            self._record(frame)
        except Exception as exc:  # noqa: BLE001 - an error here would unset the tracer silently
            self.errors.append(f"{type(exc).__name__}: {exc}")
        return None

    def _record(self, frame) -> None:
        callee = _nbdist(frame)
        thread = threading.current_thread()
        if callee is None or (thread is not self.main and self.pushed.is_set()):
            return
        code = frame.f_code
        caller_frame = _nearest(frame.f_back)
        caller = _nbdist(caller_frame) if caller_frame is not None else None
        held = None
        if caller is not None and caller != callee:
            key = (caller_frame.f_code, code)
            if key not in self._held:
                self._held[key] = _holds(caller_frame, code)
            held = self._held[key]
        name = "kernel" if thread is self.main else thread.name
        body = code.co_name == "<module>"
        self.calls[(name, caller, callee, code.co_qualname, body, held)] = None
        if not _importing(frame):
            reached = self.order.setdefault(name, [])
            for module in (caller, callee):
                if module is not None and module not in reached:
                    reached.append(module)
        if (callee, code.co_qualname) == FIRST_PUSH and thread.name == HUB:
            stack, f = [], frame
            while f is not None:
                if _nbdist(f) and (not stack or stack[-1] != _nbdist(f)):
                    stack.append(_nbdist(f))
                f = f.f_back
            self.hub_stack = stack[::-1]
            self.pushed.set()


def main() -> None:
    import nbdist

    tracer = Tracer()
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        run = nbdist.train(CELL, namespace={}, mode="local", epochs=1, batch_size=16)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    pushed = tracer.pushed.wait(120)
    run.stop()
    run.wait(60)
    keys = ("thread", "caller", "callee", "qualname", "module_body", "held")
    print(RESULT + json.dumps({
        "pushed": pushed, "status": run.status,
        "calls": [dict(zip(keys, call, strict=True)) for call in tracer.calls],
        "order": tracer.order, "hub_stack": tracer.hub_stack,
        "errors": tracer.errors}))


if __name__ == "__main__":
    main()
