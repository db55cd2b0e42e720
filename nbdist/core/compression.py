"""What crosses the wire for one flat float32 buffer: as is, or as float16 (`--compression fp16`).

fp16 halves the bytes of every async push and pull across hosts; the hub keeps and updates its
parameters in float32, and only the copy on the wire is rounded (to 11 significant bits,
|x| <= 65504: larger values saturate instead of becoming inf). Shared memory on one host
carries no bytes over the network, so it is never compressed. Pure NumPy.
"""

from __future__ import annotations

import numpy as np

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
MODES = ("none", "fp16")


def encode(values: np.ndarray, mode: str) -> np.ndarray:
    """The buffer to send for float32 `values` (the array itself when `mode` is "none").

    Example:
        >>> encode(np.array([1.0, 1e6, -3.5], dtype=np.float32), "fp16").tolist()
        [1.0, 65504.0, -3.5]
    """
    if mode == "none":
        return values
    if mode != "fp16":
        raise ValueError(f"unknown compression {mode!r}; expected one of {MODES}")
    return np.clip(values, -FP16_MAX, FP16_MAX).astype("<f2")


def decode(buffer, mode: str) -> np.ndarray:
    """A float32 array from a received frame (a view without a copy for "none")."""
    if mode == "none":
        return np.frombuffer(buffer, dtype="<f4")
    return np.frombuffer(buffer, dtype="<f2").astype(np.float32)


def decode_into(buffer, mode: str, out: np.ndarray) -> None:
    """Write a received frame into float32 `out` (one pass, no temporary for fp16)."""
    np.copyto(out, np.frombuffer(buffer, dtype="<f4" if mode == "none" else "<f2"),
              casting="unsafe")


def wire_bytes(count: int, mode: str) -> int:
    """Bytes one buffer of `count` floats takes on the wire."""
    return count * (2 if mode == "fp16" else 4)
