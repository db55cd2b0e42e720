"""Update rules the hub applies to pushed gradients: pure NumPy, in place, no I/O.

Each rule is a small class with explicit state and two hooks the hub calls:
`on_pull(worker, w)` when a worker reads the parameters and
`on_push(worker, w, g, lr, delay)` to apply a gradient that is `delay` versions old.
`consistent_reads` says whether a pull must see one version (copy) or may read live memory.
"""

from __future__ import annotations

from nbdist.algorithms.sgd import ASGD, Hogwild, sgd_step

RULES = {rule.name: rule for rule in (ASGD, Hogwild)}

__all__ = ["ASGD", "RULES", "Hogwild", "make_rule", "sgd_step"]


def make_rule(name: str, size: int, num_workers: int):
    """The rule called `name` for a shard of `size` floats shared by `num_workers` workers."""
    try:
        rule = RULES[name]
    except KeyError:
        raise ValueError(f"Unknown algorithm {name!r}. Expected one of: {', '.join(sorted(RULES))}.") from None
    return rule(size, num_workers)
