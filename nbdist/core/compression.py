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
| `powersgd:R` | float32 factors P, Q of each matrix, then the others (`low_rank`) | see there |

- `int8`: q = rint(x / s), s = max|x| / 127 over the chunk; decoded q s.
- `qsgd:S` (Alistarh et al. 2017): l = floor(|x| / norm * S + u), u uniform in [0, 1), so that
  the decoded sign(x) l norm / S is x on average.
- `topk:R` / `randomk:R` keep k entries of the frame. Their pushes carry **error feedback**
  (Stich et al. 2018, Deep Gradient Compression): what a worker's frame left out is added to
  its next gradient (`PushEncoder`), so nothing is lost, only late.
- `powersgd:R` (Vogels et al. 2019) sends each of the slice's weight matrices as P Q^T, P and Q
  of R columns, with error feedback too; it needs the slice's variable shapes
  (`Codec.bind`), and an unbound one sends everything dense.
- **Pulls of a lossy codec** (int8, qsgd, topk, randomk) carry the change since the copy the
  worker holds, never the weights themselves: the hub (`PullEncoder`) and the worker
  (`PullDecoder`) add the same decoded numbers to their copies, which so stay equal, and what
  one pull leaves out is in the next change. The first pull after a hello, and a pull for an
  evaluation, send the float32 weights in full. qsgd's pulls go as int8: its random error can
  exceed the change it encodes (by up to sqrt(512) / S), so that changes of changes would grow.
  powersgd's pulls go as int8 too: its factors are a gradient compressor's, which would need a
  warm-started Q per worker on the hub, for a change that int8 already sends in a quarter.

Pure NumPy; randomised codecs draw from the `numpy.random.Generator` they are given, so a
frame is exact against a reference given the same stream (tests/unit/test_compression_format.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nbdist.core.low_rank import (
    LowRankReceiver,
    LowRankSender,
    Matrix,
    frame_floats,
    matrices_in,
)

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
CHUNK = 512  # floats per scale (int8) or norm (qsgd): 1% of the frame's bytes
NAMES = ("none", "fp16", "int8", "topk", "randomk", "qsgd", "powersgd")
SYNTAX = "none, fp16, int8, topk:RATIO, randomk:RATIO, qsgd:LEVELS or powersgd:RANK"
MAX_RANK = 1024  # powersgd: factors wider than this save nothing on any model nbdist trains
_EXAMPLES = "e.g. --compression topk:0.01 (1% of the entries) or --compression qsgd:16"


@dataclass(frozen=True)
class Codec:
    """A parsed `--compression` value: the codec's name and its amount (a ratio for topk and
    randomk, a number of levels for qsgd, a rank for powersgd, None otherwise). A powersgd
    codec bound to a slice (`bind`) also holds the slice's matrices.

    Example:
        >>> c = parse("topk:0.01")
        >>> c.name, c.amount, str(c), c.wire_bytes(1000), c.lossy, c.error_feedback
        ('topk', 0.01, 'topk:0.01', 80, True, True)
    """

    name: str
    amount: float | None = None
    matrices: tuple[Matrix, ...] = field(default=(), repr=False)  # powersgd, once bound

    def __str__(self) -> str:
        if self.amount is None:
            return self.name
        whole = self.name in ("qsgd", "powersgd")
        return f"{self.name}:{int(self.amount) if whole else self.amount:g}"

    def bind(self, shapes: Sequence[Sequence[int]], lo: int, hi: int) -> Codec:
        """This codec for the slice `[lo, hi)` of a flat vector of variables of `shapes`: for
        powersgd, with the slice's matrices (`low_rank.matrices_in`); the others are unchanged.

        Example:
            >>> parse("powersgd:4").bind([(784, 256), (256,)], 0, 200960).matrices
            ((0, 784, 256),)
        """
        if self.name != "powersgd":
            return self
        return replace(self, matrices=matrices_in(shapes, lo, hi, int(self.amount)))

    @property
    def lossy(self) -> bool:
        """Whether pulls send changes against the worker's copy instead of the weights."""
        return self.name not in ("none", "fp16")

    @property
    def gathered(self) -> bool:
        """Whether sync exchanges its frames by an allgather: an allreduce cannot sum them
        (int8, qsgd, topk, randomk; powersgd allreduces its factors, fp16 its floats)."""
        return self.name not in ("none", "fp16", "powersgd")

    @property
    def sparse(self) -> bool:
        return self.name in ("topk", "randomk")

    @property
    def error_feedback(self) -> bool:
        """Whether a worker adds what its last push left out to its next one."""
        return self.sparse or self.name == "powersgd"

    @property
    def random(self) -> bool:
        return self.name in ("randomk", "qsgd", "powersgd")  # powersgd: its first Q

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
        if self.name == "powersgd":
            return 4 * frame_floats(count, self.matrices, int(self.amount))
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
        what = {"qsgd": "LEVELS", "powersgd": "RANK"}.get(name, "RATIO")
        raise ValueError(f"--compression {name} needs its amount: {name}:{what}; {_EXAMPLES}.")
    if name == "qsgd":
        if not amount.isdigit() or not 1 <= int(amount) <= 127:
            raise ValueError(f"--compression {spec!r}: the number of levels must be a whole "
                             "number from 1 to 127 (each level is sent as one signed byte); "
                             "e.g. qsgd:16.")
        return Codec(name, int(amount))
    if name == "powersgd":
        if not amount.isdigit() or not 1 <= int(amount) <= MAX_RANK:
            raise ValueError(f"--compression {spec!r}: the rank is the number of columns of each "
                             f"matrix's factors, a whole number from 1 to {MAX_RANK}; e.g. "
                             "powersgd:4 (the PowerSGD paper's ranks are 1 to 4).")
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
    if codec.name == "powersgd":  # a first Q drawn for this frame alone (PushEncoder keeps it)
        return LowRankSender(codec.matrices, int(codec.amount), values.size, rng).encode(values)
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
    elif codec.name == "powersgd":
        decoded = np.empty(count, dtype=np.float32)
        _low_rank(codec, count).decode_into(frame, decoded)
        out += decoded
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
    if codec.name == "powersgd":  # every value written: no zeroing first
        _low_rank(codec, out.size).decode_into(_frame(buffer, codec, out.size), out)
        return
    if codec.lossy:
        out[:] = 0
        decode_add(buffer, codec, out)
        return
    np.copyto(out, np.frombuffer(_frame(buffer, codec, out.size),
                                 dtype="<f4" if codec.name == "none" else "<f2"),
              casting="unsafe")


@functools.lru_cache(maxsize=64)
def _low_rank(codec: Codec, count: int) -> LowRankReceiver:
    """One receiver per bound codec and slice (a hub's shard decodes every worker's pushes with
    it): its index of the dense floats is built once, not per push."""
    return LowRankReceiver(codec.matrices, int(codec.amount), count)


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
    """One worker's pushes to one shard, with error feedback for topk, randomk and powersgd:
    the frame is taken of the gradient plus what earlier frames left out, and what this one
    leaves out is kept (`residual`) for the next. powersgd's Qs carry on from frame to frame.

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
        self._low_rank = None
        if self.codec.name == "powersgd":
            if rng is None:
                raise ValueError(f"--compression {self.codec} draws its first Q at random: pass "
                                 "its generator")
            self._low_rank = LowRankSender(self.codec.matrices, int(self.codec.amount), count, rng)
            self._sent = np.empty(count, dtype=np.float32)

    def encode(self, gradient: np.ndarray) -> np.ndarray:
        if self.residual is None:
            return encode(gradient, self.codec, self.rng)
        self.residual += gradient
        if self._low_rank is not None:
            frame = self._low_rank.encode(self.residual)
            decode_into(frame, self.codec, self._sent)
            self.residual -= self._sent  # the other floats went exactly: 0 of them is left
            return frame
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
    """The codec of a pull under `codec`: itself, but int8 for qsgd and powersgd."""
    codec = parse(codec)
    return Codec("int8") if codec.name in ("qsgd", "powersgd") else codec


def apply_pull(buffer, codec, held: np.ndarray, out: np.ndarray) -> None:
    """A worker's side of `PullEncoder`: add the frame to its copy `held`, and copy that into
    `out` (its weights)."""
    decode_add(buffer, pull_codec(codec), held)
    np.copyto(out, held)
