"""What a pipeline stage accepts from its neighbours, checked like the hub checks its messages:
pure functions, no sockets.

- `message_limits`: the most frames and bytes a message to each stage can have, from the
  profile's live tensors at its cuts (the hub's frame limit, `ZMQ_MAXMSGSIZE` and
  `recv_bounded`, are set from these, so an oversized message is refused before its MAC);
  `weights_limits`: the same for the kernel's reports when the stages send it their weights;
- `stage_message`: the typed message of a signed header, from a neighbour (a signed but
  malformed header is dropped and counted, never raised);
- `arrays_of`: the arrays of a message, after checking its frame table (shapes, dtypes and
  the buffers' sizes agree, and no dtype holds Python objects).
Each raises `ProtocolError`, whose `reason` is what the drop is counted under.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from nbdist.errors import ProtocolError
from nbdist.hub.protocol import MAX_HEADER_BYTES, SIGNATURE_BYTES
from nbdist.modes.pipeline.messages import STAGE_MESSAGES, decode
from nbdist.wire.schema import Wire

MARGIN = 2  # on the measured bytes per sample (a legit message refused would stall the run)
HEADER_BYTES = SIGNATURE_BYTES + MAX_HEADER_BYTES
REPORT_LIMITS = (1, HEADER_BYTES)  # the kernel's reports: a signed header, no arrays


def message_limits(cut_bytes: list[int], cut_items: list[int], cut_tensors: list[int], bounds: list,
                   micro_batch: int, samples: int) -> list[tuple[int, int]]:
    """(frames, bytes) at most per message to each stage. A stage receives the live tensors at
    the cut before it (forward, validation) and their gradients at the cut after it
    (backward, float32 where a tensor is not a float); `cut_*[k]` describe the cut after step
    k for `micro_batch` samples; a message carries at most `samples` (a validation batch).

    Example:
        >>> message_limits([64, 32], [16, 8], [1, 2], [(0, 1), (1, 3)], micro_batch=2, samples=4)[1]
        (2, 65824)
    """
    limits = []
    for start, end in bounds:
        cuts = [k for k in (start - 1, end - 1) if 0 <= k < len(cut_bytes)]
        per_sample = max((max(cut_bytes[k], 4 * cut_items[k]) / max(1, micro_batch)
                          for k in cuts), default=0)
        frames = 1 + max((cut_tensors[k] for k in cuts), default=0)
        limits.append((frames, HEADER_BYTES + math.ceil(MARGIN * per_sample * samples)))
    return limits


def weights_limits(sizes: list[int]) -> tuple[int, int]:
    """(frames, bytes) at most of a message to the kernel when a cell's fit call has every
    stage send its weights at each epoch's end (`messages.Weights`): a signed header and, at
    most, every variable of the model; `sizes`: each variable's bytes.

    Example:
        >>> weights_limits([4096, 64, 4096])
        (4, 73824)
    """
    return 1 + len(sizes), HEADER_BYTES + sum(sizes)


def stage_message(h: Mapping, neighbours) -> Wire:
    """The typed message (`messages.STAGE_MESSAGES`) in a verified header from a neighbour, or
    ProtocolError("malformed header") if its op or a field is not one a stage sends, or its
    sender is not among `neighbours`."""
    message = decode(STAGE_MESSAGES, h)
    if message.src not in neighbours:
        raise ProtocolError("malformed header", f"{message.OP} from {message.src!r}, expected one "
                            f"of {', '.join(sorted(neighbours))}")
    return message


def arrays_of(shapes: list[list[int]], dtypes: list[str], buffers: list) -> list[np.ndarray]:
    """The arrays a verified message carries in its frames (zero-copy views), once its frame
    table is checked: as many shapes and dtypes as buffers, each a number dtype whose size
    times the shape's elements is the buffer's length.

    Example:
        >>> arrays_of([[2]], ["<f4"], [bytes(8)])[0].tolist()
        [0.0, 0.0]
    """
    shapes, parsed = _table(shapes, dtypes, len(buffers))
    arrays = []
    for b, d, s in zip(buffers, parsed, shapes, strict=True):
        if d.itemsize * math.prod(s) != memoryview(b).nbytes:
            raise ProtocolError("malformed header",
                                f"{d} {list(s)} is not {memoryview(b).nbytes} bytes")
        arrays.append(np.frombuffer(b, dtype=d).reshape(s))
    return arrays


def slot_table(shapes: list[list[int]], dtypes: list[str], offsets: list[int],
               segment_bytes: int) -> list[tuple[np.dtype, tuple, int]]:
    """(dtype, shape, offset) of each array a shared-memory message names, once checked to lie
    inside the sender's segment of `segment_bytes`."""
    shapes, parsed = _table(shapes, dtypes, len(offsets))
    for d, s, off in zip(parsed, shapes, offsets, strict=True):
        if off < 0 or off + d.itemsize * math.prod(s) > segment_bytes:
            raise ProtocolError("malformed header",
                                f"{d} {s} at byte {off} of a {segment_bytes}-byte segment")
    return list(zip(parsed, shapes, offsets, strict=True))


def _table(shapes: list[list[int]], dtypes: list[str],
           count: int) -> tuple[list[tuple], list[np.dtype]]:
    """The shapes and parsed dtypes of `count` arrays (their types the message's schema checked)."""
    if not (len(shapes) == len(dtypes) == count and all(n >= 0 for s in shapes for n in s)):
        raise ProtocolError("malformed header", f"a frame table of {count} array(s) expected, got "
                            f"shapes {str(shapes)[:80]}, dtypes {str(dtypes)[:80]}")
    try:
        parsed = [np.dtype(d) for d in dtypes]
    except TypeError:
        raise ProtocolError("malformed header", f"dtypes {str(dtypes)[:80]}") from None
    if any(d.kind not in "biufc" or d.fields is not None or d.subdtype is not None for d in parsed):
        raise ProtocolError("malformed header", f"dtypes {str(dtypes)[:80]}, expected numbers")
    return [tuple(s) for s in shapes], parsed
