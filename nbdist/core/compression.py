"""What crosses the wire for one flat float32 buffer (`--compression`): the codecs, their exact
frame formats, and the error feedback that keeps a lossy codec from losing what it leaves out.

The hub keeps and updates its parameters in float32; only the copy on the wire changes.
Shared memory on one host carries no bytes over a network, so it is never compressed.

| codec | a frame of n floats | bytes |
|---|---|---|
| `none` | float32[n] | 4n |
| `fp16` | float16[n] (saturating at +-65504) | 2n |
| `int8` | float32 scale per chunk of 512, then int8[n] | n + 4 ceil(n/512) |
| `qsgd:S` | float32 norm per chunk of 512, then int8[n] levels in -S..S | n + 4 ceil(n/512) |
| `topk:R` | uint32[k] indices (ascending), then float32[k] values; k = ceil(R n) | 8k |
| `randomk:R` | as `topk:R`, with k indices drawn at random | 8k |

- `int8`: q = rint(x / s), s = max|x| / 127 over the chunk; decoded q s.
- `qsgd:S` (Alistarh et al. 2017): l = floor(|x| / norm * S + u), u uniform in [0, 1), so that
  the decoded sign(x) l norm / S is x on average.
- `topk:R` / `randomk:R` keep k entries of the frame. Their pushes carry **error feedback**
  (Stich et al. 2018, Deep Gradient Compression): what a worker's frame left out is added to
  its next gradient (`PushEncoder`), so nothing is lost, only late.
- **Pulls of a lossy codec** (int8, qsgd, topk, randomk) carry the change since the copy the
  worker holds, never the weights themselves: the hub (`PullEncoder`) and the worker
  (`PullDecoder`) add the same decoded numbers to their copies, which so stay equal, and what
  one pull leaves out is in the next change. The first pull after a hello, and a pull for an
  evaluation, send the float32 weights in full. qsgd's pulls go as int8: its random error can
  exceed the change it encodes (by up to sqrt(512) / S), so that changes of changes would grow.

Pure NumPy; randomised codecs draw from the `numpy.random.Generator` they are given, so a
frame is exact against a reference given the same stream (tests/unit/test_compression_format.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
CHUNK = 512  # floats per scale (int8) or norm (qsgd): 1% of the frame's bytes
NAMES = ("none", "fp16", "int8", "topk", "randomk", "qsgd")
SYNTAX = "none, fp16, int8, topk:RATIO, randomk:RATIO or qsgd:LEVELS"
_EXAMPLES = "e.g. --compression topk:0.01 (1% of the entries) or --compression qsgd:16"


@dataclass(frozen=True)
class Codec:
    """A parsed `--compression` value: the codec's name and its amount (a ratio for topk and
    randomk, a number of levels for qsgd, None otherwise).

    Example:
        >>> c = parse("topk:0.01")
        >>> c.name, c.amount, str(c), c.wire_bytes(1000), c.lossy, c.error_feedback
        ('topk', 0.01, 'topk:0.01', 80, True, True)
    """

    name: str
    amount: float | None = None

    def __str__(self) -> str:
        if self.amount is None:
            return self.name
        return f"{self.name}:{int(self.amount) if self.name == 'qsgd' else self.amount:g}"

    @property
    def lossy(self) -> bool:
        """Whether pulls send changes against the worker's copy instead of the weights."""
        return self.name not in ("none", "fp16")

    @property
    def sparse(self) -> bool:
        return self.name in ("topk", "randomk")

    @property
    def error_feedback(self) -> bool:
        """Whether a worker adds what its last push left out to its next one."""
        return self.sparse

    @property
    def random(self) -> bool:
        return self.name in ("randomk", "qsgd")

    def kept(self, count: int) -> int:
        """Entries a sparse frame of `count` floats keeps (at least one)."""
        return min(count, max(1, math.ceil(self.amount * count)))

    def wire_bytes(self, count: int) -> int:
        """Bytes one frame of `count` floats takes on the wire."""
        if self.name == "none":
            return 4 * count
        if self.name == "fp16":
            return 2 * count
        if self.sparse:
            return 8 * self.kept(count) if count else 0
        return count + 4 * _chunks(count)


def parse(spec) -> Codec:
    """The codec a `--compression` value names; ValueError saying what is expected.

    Example:
        >>> parse("qsgd:16"), parse(" FP16 ")
        (Codec(name='qsgd', amount=16), Codec(name='fp16', amount=None))
    """
    if isinstance(spec, Codec):
        return spec
    text = str(spec).strip().lower()
    name, _, amount = text.partition(":")
    if name not in NAMES:
        raise ValueError(f"Unknown --compression {spec!r}. Expected one of: {SYNTAX}; "
                         f"{_EXAMPLES}.")
    if name in ("none", "fp16", "int8"):
        if amount:
            raise ValueError(f"--compression {name} takes no amount, got {spec!r}; pass "
                             f"--compression {name}.")
        return Codec(name)
    if not amount:
        what = "LEVELS" if name == "qsgd" else "RATIO"
        raise ValueError(f"--compression {name} needs its amount: {name}:{what}; {_EXAMPLES}.")
    if name == "qsgd":
        if not amount.isdigit() or not 1 <= int(amount) <= 127:
            raise ValueError(f"--compression {spec!r}: the number of levels must be a whole "
                             "number from 1 to 127 (each level is sent as one signed byte); "
                             "e.g. qsgd:16.")
        return Codec(name, int(amount))
    try:
        ratio = float(amount)
    except ValueError:
        ratio = math.nan
    if not 0 < ratio <= 1:
        raise ValueError(f"--compression {spec!r}: the ratio is the share of entries each frame "
                         f"keeps, a number in (0, 1]; e.g. {name}:0.01 keeps 1%.")
    return Codec(name, ratio)


def _chunks(count: int) -> int:
    return -(-count // CHUNK)


def _blocks(values: np.ndarray) -> np.ndarray:
    """`values` as rows of CHUNK floats, the last one padded with zeros (a copy)."""
    rows = _chunks(values.size)
    blocks = np.zeros((rows, CHUNK), dtype=np.float32)
    blocks.reshape(-1)[:values.size] = values
    return blocks


def encode(values: np.ndarray, codec, rng: np.random.Generator | None = None) -> np.ndarray:
    """The frame to send for float32 `values` (the array itself for "none").

    Example:
        >>> encode(np.array([1.0, 1e6, -3.5], dtype=np.float32), "fp16").tolist()
        [1.0, 65504.0, -3.5]
    """
    codec = parse(codec)
    if codec.name == "none":
        return values
    if codec.name == "fp16":
        return np.clip(values, -FP16_MAX, FP16_MAX).astype("<f2")
    if codec.random and rng is None:
        raise ValueError(f"--compression {codec} draws at random: pass its generator")
    if codec.sparse:
        return _encode_sparse(values, codec, rng)
    return _encode_chunked(values, codec, rng)


def _encode_sparse(values: np.ndarray, codec: Codec, rng) -> np.ndarray:
    n = values.size
    k = codec.kept(n)
    frame = np.empty(8 * k, dtype=np.uint8)
    if k == 0:  # an empty slice: an empty frame
        return frame
    index = frame[:4 * k].view("<u4")
    if codec.name == "topk":
        index[:] = np.argpartition(np.abs(values), n - k)[n - k:]
    else:
        index[:] = rng.choice(n, size=k, replace=False)
    index.sort()
    np.take(values, index, out=frame[4 * k:].view("<f4"))
    return frame


def _encode_chunked(values: np.ndarray, codec: Codec, rng) -> np.ndarray:
    n, rows = values.size, _chunks(values.size)
    frame = np.empty(4 * rows + n, dtype=np.uint8)
    blocks = _blocks(values)
    if codec.name == "int8":
        scale = np.abs(blocks).max(axis=1) / np.float32(127)
        divisor = np.where(scale > 0, scale, np.float32(1))
        levels = np.rint(blocks / divisor[:, None])
    else:  # qsgd
        scale = np.sqrt(np.square(blocks).sum(axis=1))
        divisor = np.where(scale > 0, scale, np.float32(1))
        unit = rng.random(blocks.shape, dtype=np.float32)
        magnitude = np.floor(np.abs(blocks) / divisor[:, None] * np.float32(codec.amount) + unit)
        levels = np.copysign(magnitude, blocks)
    bound = 127 if codec.name == "int8" else codec.amount
    frame[:4 * rows].view("<f4")[:] = scale
    np.clip(levels, -bound, bound, out=levels)
    frame[4 * rows:].view(np.int8)[:] = levels.reshape(-1)[:n]
    return frame


def _frame(buffer, codec: Codec, count: int) -> np.ndarray:
    """A received frame as bytes, checked to be the length `count` floats take."""
    frame = np.frombuffer(buffer, dtype=np.uint8)
    if frame.size != codec.wire_bytes(count):
        raise ValueError(f"a --compression {codec} frame of {count} floats takes "
                         f"{codec.wire_bytes(count)} bytes, this one {frame.size}")
    return frame


def decode_add(buffer, codec, out: np.ndarray) -> None:
    """Add a received frame's values to float32 `out` (in place; a sparse frame touches only
    its k entries)."""
    codec = parse(codec)
    count = out.size
    frame = _frame(buffer, codec, count)
    if codec.sparse:
        k = codec.kept(count)
        index = frame[:4 * k].view("<u4")
        if k and int(index[-1]) >= count:  # ascending: the last is the largest
            raise ValueError(f"a --compression {codec} frame names entry {int(index[-1])} of "
                             f"{count}")
        out[index] += frame[4 * k:].view("<f4")
    elif codec.lossy:
        out += _chunked_values(frame, codec, count)
    else:
        out += np.frombuffer(buffer, dtype="<f4" if codec.name == "none" else "<f2")


def _chunked_values(frame: np.ndarray, codec: Codec, count: int) -> np.ndarray:
    rows = _chunks(count)
    scale = frame[:4 * rows].view("<f4")
    if codec.name == "qsgd":
        scale = scale / np.float32(codec.amount)
    levels = np.zeros(rows * CHUNK, dtype=np.float32)
    levels[:count] = frame[4 * rows:].view(np.int8)
    return (levels.reshape(rows, CHUNK) * scale[:, None]).reshape(-1)[:count]


def decode_into(buffer, codec, out: np.ndarray) -> None:
    """Write a received frame's values into float32 `out` (one pass for none and fp16)."""
    codec = parse(codec)
    if codec.lossy:
        out[:] = 0
        decode_add(buffer, codec, out)
        return
    np.copyto(out, np.frombuffer(_frame(buffer, codec, out.size),
                                 dtype="<f4" if codec.name == "none" else "<f2"),
              casting="unsafe")


def decode(buffer, codec, count: int | None = None) -> np.ndarray:
    """A float32 array from a received frame (a view without a copy for "none"; the lossy
    codecs need `count`, the floats the frame stands for)."""
    codec = parse(codec)
    if codec.name == "none":
        return np.frombuffer(buffer, dtype="<f4")
    if codec.name == "fp16":
        return np.frombuffer(buffer, dtype="<f2").astype(np.float32)
    out = np.empty(count, dtype=np.float32)
    decode_into(buffer, codec, out)
    return out


def wire_bytes(count: int, codec) -> int:
    """Bytes one buffer of `count` floats takes on the wire."""
    return parse(codec).wire_bytes(count)


class PushEncoder:
    """One worker's pushes to one shard, with error feedback for topk and randomk: the frame
    is taken of the gradient plus what earlier frames left out, and what this one leaves out
    is kept (`residual`) for the next.

    Example:
        >>> push = PushEncoder("topk:0.5", 4)
        >>> push.encode(np.array([4.0, -1.0, 0.5, 3.0], dtype=np.float32)).view("<u4")[:2].tolist()
        [0, 3]
        >>> push.residual.tolist()
        [0.0, -1.0, 0.5, 0.0]
    """

    def __init__(self, codec, count: int, rng: np.random.Generator | None = None):
        self.codec = parse(codec)
        self.rng = rng
        self.residual = (np.zeros(count, dtype=np.float32) if self.codec.error_feedback
                         else None)

    def encode(self, gradient: np.ndarray) -> np.ndarray:
        if self.residual is None:
            return encode(gradient, self.codec, self.rng)
        self.residual += gradient
        frame = encode(self.residual, self.codec, self.rng)
        k = self.codec.kept(self.residual.size)
        self.residual[frame[:4 * k].view("<u4")] = 0  # sent exactly: nothing of them is left
        return frame


class PullEncoder:
    """A hub shard's pulls to one worker under a lossy codec: each frame is the change from
    the copy the worker holds (`held`) to the weights, and `held` takes what the frame says.

    Example:
        >>> pull = PullEncoder("topk:0.5", 4)
        >>> pull.held[:] = [1.0, 1.0, 1.0, 1.0]
        >>> _ = pull.encode(np.array([1.0, 3.0, 1.5, -2.0], dtype=np.float32))
        >>> pull.held.tolist()
        [1.0, 3.0, 1.0, -2.0]
    """

    def __init__(self, codec, count: int, rng: np.random.Generator | None = None):
        self.codec = pull_codec(codec)
        self.rng = rng
        self.held = np.zeros(count, dtype=np.float32)
        self._change = np.empty(count, dtype=np.float32)

    def encode(self, weights: np.ndarray) -> np.ndarray:
        np.subtract(weights, self.held, out=self._change)
        frame = encode(self._change, self.codec, self.rng)
        decode_add(frame, self.codec, self.held)
        return frame


def pull_codec(codec) -> Codec:
    """The codec of a pull under `codec`: itself, but int8 for qsgd."""
    codec = parse(codec)
    return Codec("int8") if codec.name == "qsgd" else codec


def apply_pull(buffer, codec, held: np.ndarray, out: np.ndarray) -> None:
    """A worker's side of `PullEncoder`: add the frame to its copy `held`, and copy that into
    `out` (its weights)."""
    decode_add(buffer, pull_codec(codec), held)
    np.copyto(out, held)
