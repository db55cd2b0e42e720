"""How the flat parameter vector is cut into hub shards: contiguous, nearly equal slices,
aligned to cache lines, never cutting a variable whose weight constraint needs all of it on one
shard. Pure arithmetic, so the kernel's job (`nbdist.job`), the launch of the shards and the
benchmarks cut the same way."""

from __future__ import annotations

from collections.abc import Sequence

from nbdist.errors import ConfigError


def shard_bounds(size: int, num_shards: int, align: int = 16,
                 whole: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Split a flat vector of `size` floats into `num_shards` contiguous nearly equal slices.

    Slice starts are multiples of `align` floats (64 bytes: one cache line) so no two shards
    share a line. `whole`: `[start, end)` ranges no boundary may fall inside (variables with a
    Keras constraint, whose norms need all of them on one shard): a boundary that would is
    moved to the range's nearer edge, and if the shards cannot all hold something that way,
    a `ConfigError` says how many shards the model allows.

    Example:
        >>> shard_bounds(100, 2)
        [(0, 48), (48, 100)]
        >>> shard_bounds(100, 2, whole=[(30, 60)])
        [(0, 60), (60, 100)]
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 (Received: {num_shards}).")
    if size < num_shards * align:
        align = 1
    cuts = [min(size, round(size * i / num_shards / align) * align) for i in range(num_shards)]
    whole = [(s, e) for s, e in whole if e - s > 1]
    if whole and size:
        for i in range(1, num_shards):
            cut = _cut_outside(cuts[i], cuts[i - 1], size, whole)
            if cut is None:
                most = size - sum(e - s - 1 for s, e in whole)  # the places a cut may go, + 1
                raise ConfigError(
                    f"The model cannot be split into {num_shards} parameter shards without "
                    f"cutting a variable that has a weight constraint (the hub needs all of such "
                    f"a variable on one shard to compute its norms). Received: --servers "
                    f"{num_shards} for {size} floats, {len(whole)} constrained variable(s) holding "
                    f"{sum(e - s for s, e in whole)} of them. Use --servers "
                    f"{min(most, num_shards - 1)} or fewer.")
            cuts[i] = cut
    return list(zip(cuts, [*cuts[1:], size], strict=False))


def _cut_outside(cut: int, previous: int, size: int,
                 whole: Sequence[tuple[int, int]]) -> int | None:
    """The place nearest to `cut`, after `previous` and before `size`, not inside a `whole`
    range."""
    places = []
    for x in (cut, previous + 1):
        inside = next(((s, e) for s, e in whole if s < x < e), None)
        places += [x] if inside is None else list(inside)
    valid = [x for x in places if previous < x < size]
    return min(valid, key=lambda x: (abs(x - cut), x)) if valid else None
