"""A hub shard as its own OS process, so its loop never waits for the engine's GIL.

Started by `nbdist.hub.launch` on the engine with `python -m nbdist.hub.process`: the spec
comes over stdin (a pipe from the parent engine) as one JSON line plus the raw bytes of its
arrays (`encode_spec`: no pickle, like everything else the hub reads), the endpoints and, at
the end, the summary go back as JSON lines on the original stdout (anything else the hub
prints goes to stderr). The process leaves when the hub does, on SIGTERM (the
engine asking it to close), or when its parent engine is gone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO

import numpy as np

from nbdist.core.coordinator import Plan

PARENT_CHECK_S = 1.0


def _classes() -> dict[str, type]:
    from nbdist.hub.server import HubSpec  # as in main(): imported inside its try

    return {"HubSpec": HubSpec, "Plan": Plan}  # the only objects a spec is built of


def encode_spec(spec: Any) -> bytes:
    """A `HubSpec` as one JSON line (arrays, bytes, tuples and the spec's dataclasses tagged)
    followed by the arrays' bytes in order.

    Example:
        >>> import io
        >>> data = encode_spec({"a": np.arange(3, dtype=np.float32), "k": b"\\x01", "t": (1, 2)})
        >>> decode_spec(io.BytesIO(data))["a"].tolist()
        [0.0, 1.0, 2.0]
    """
    arrays: list[np.ndarray] = []

    def tagged(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            arrays.append(np.ascontiguousarray(value))
            return {"$a": [len(arrays) - 1, value.dtype.str, list(value.shape)]}
        if isinstance(value, bytes):
            return {"$b": value.hex()}
        if isinstance(value, tuple):
            return {"$t": [tagged(v) for v in value]}
        if isinstance(value, dict):
            return {"$m": [[tagged(k), tagged(v)] for k, v in value.items()]}
        if isinstance(value, list):
            return [tagged(v) for v in value]
        if dataclasses.is_dataclass(value) and type(value).__name__ in _classes():
            return {"$d": type(value).__name__,
                    "f": {f.name: tagged(getattr(value, f.name))
                          for f in dataclasses.fields(value)}}
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"A hub spec cannot carry a {type(value).__name__} to the hub process. "
                        "Expected arrays, bytes, numbers, strings, lists, tuples, dicts.")

    line = json.dumps(tagged(spec)).encode() + b"\n"
    return line + b"".join(a.tobytes() for a in arrays)


def decode_spec(stream: BinaryIO) -> Any:
    """The value `encode_spec` wrote, read from `stream`."""
    tree = json.loads(stream.readline())
    classes = _classes()

    def built(value: Any) -> Any:
        if isinstance(value, list):
            return [built(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "$b" in value:
            return bytes.fromhex(value["$b"])
        if "$t" in value:
            return tuple(built(v) for v in value["$t"])
        if "$m" in value:
            return {built(k): built(v) for k, v in value["$m"]}
        return classes[value["$d"]](**{k: built(v) for k, v in value["f"].items()})

    order: list[list] = []

    def collect(value: Any) -> None:  # array slots in the order encode_spec wrote them
        if isinstance(value, dict):
            if "$a" in value:
                order.append(value["$a"])
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)

    collect(tree)
    arrays = {}
    for index, dtype, shape in sorted(order):
        count = int(np.prod(shape)) if shape else 1
        raw = stream.read(count * np.dtype(dtype).itemsize)
        arrays[index] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def resolve(value: Any) -> Any:
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            if "$a" in value:
                return arrays[value["$a"][0]]
            return {k: resolve(v) for k, v in value.items()}
        return value

    return built(resolve(tree))


def main() -> None:
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to stderr, not into the result stream
    try:
        from nbdist.hub.server import Hub  # inside the try: a failed import reaches the engine

        spec = decode_spec(sys.stdin.buffer)
        hub = Hub(spec)
    except BaseException as exc:  # noqa: BLE001 - reported to the engine
        traceback.print_exc()
        results.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return
    results.write(json.dumps({"endpoints": hub.endpoints}) + "\n")

    def close(*_):
        hub.closing = True

    signal.signal(signal.SIGTERM, close)
    parent = os.getppid()

    def watch_parent() -> None:
        while not hub.closing:
            if os.getppid() != parent:  # the engine died: nobody will join this hub
                hub.closing = True
            time.sleep(PARENT_CHECK_S)

    threading.Thread(target=watch_parent, daemon=True, name="nbdist-hub-parent").start()
    summary = hub.serve()
    results.write(json.dumps({"summary": summary}, default=str) + "\n")


if __name__ == "__main__":
    main()
