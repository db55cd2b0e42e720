"""Update rules the hub applies to pushed gradients: pure NumPy, in place, no I/O.

Each rule is a small `Rule` with explicit state and hooks the hub calls:
`on_pull(worker, w, version)` when a worker reads the parameters,
`on_push(worker, w, g, lr, delay) -> bool` to apply a gradient `delay` versions old (False:
buffered, `w` unchanged), `forget(worker)` when a worker leaves. `consistent_reads` says whether
a pull must see one version (copy) or may read live memory. Every push runs on preallocated
buffers: no allocation proportional to the model.

Modules: `sgd` (asgd, hogwild), `dc` (dc-asgd, dc-asgd-a, ddc-asgd), `snapshots` (shared
backups), `softsync`, `ssp` (with `StalenessClock`), `group` (speed groups), `easgd`,
`local_sgd` (async-local-sgd's delayed Nesterov), `streaming` (streaming-diloco's fragments),
`optimizers` and `schedules` (Keras's optimizers and learning-rate schedules in NumPy, which
the hub applies to what the rule decides: see `nbdist.core.updater`), `constraints` (Keras's
weight constraints, applied after each update).
"""

from __future__ import annotations

from collections.abc import Mapping

from nbdist.algorithms.base import Option, Rule
from nbdist.algorithms.custom import CUSTOM
from nbdist.algorithms.dc import DCASGD, DDCASGD, DCASGDAdaptive, dc_compensate, ddc_beta
from nbdist.algorithms.easgd import EASGD, easgd_alpha, elastic_exchange
from nbdist.algorithms.group import DiLoCo, Group, form_groups, group_lr, mean_into
from nbdist.algorithms.local_sgd import AsyncLocalSGD
from nbdist.algorithms.sgd import ASGD, Hogwild, sgd_step
from nbdist.algorithms.snapshots import SnapshotStore
from nbdist.algorithms.softsync import SoftSync
from nbdist.algorithms.ssp import SSP, StalenessClock
from nbdist.algorithms.streaming import StreamingDiLoCo
from nbdist.errors import ConfigError

# The rules' catalogue, in the order of `nbdist.choices.Algorithm` (tests/unit/test_rules.py):
# each rule declares its options and defaults (`default_options`) and what it can be combined
# with (`predicts_weights`, `corrects_momentum`, `compensates_delay`, `takes_local_steps`,
# `workers_step`)
RULES: dict[str, type[Rule]] = {rule.name: rule for rule in (
    ASGD, Hogwild, DCASGD, DCASGDAdaptive, DDCASGD, SoftSync, SSP, Group, EASGD, DiLoCo,
    AsyncLocalSGD, StreamingDiLoCo)}
CAPABILITIES = ("predicts_weights", "corrects_momentum", "compensates_delay",
                "takes_local_steps", "workers_step")


def rules_that(capability: str) -> tuple[str, ...]:
    """The rules that declare `capability` (one of CAPABILITIES), in the catalogue's order.

    Example:
        >>> rules_that("predicts_weights")
        ('asgd', 'ssp')
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"Unknown capability {capability!r}; known: {', '.join(CAPABILITIES)}.")
    return tuple(name for name, rule in RULES.items() if getattr(rule, capability))


def prediction_default() -> str:
    """--predict-weights's default, as the reference shows it."""
    return (f"on with {' and '.join(rules_that('predicts_weights'))} at --local-steps 1, "
            "off otherwise")


def momentum_correction_default() -> str:
    """--momentum-correction's default, as the reference shows it."""
    return (f"on for SGD with momentum where lr/(1-momentum) x (workers-1)^2 >= 0.5, with "
            f"{', '.join(rules_that('corrects_momentum'))}; off otherwise")

__all__ = [
    "ASGD",
    "DCASGD",
    "DDCASGD",
    "EASGD",
    "CAPABILITIES",
    "RULES",
    "SSP",
    "DCASGDAdaptive",
    "AsyncLocalSGD",
    "DiLoCo",
    "Group",
    "Hogwild",
    "Rule",
    "SnapshotStore",
    "SoftSync",
    "StalenessClock",
    "StreamingDiLoCo",
    "dc_compensate",
    "ddc_beta",
    "easgd_alpha",
    "elastic_exchange",
    "form_groups",
    "group_lr",
    "make_rule",
    "rule_class",
    "mean_into",
    "momentum_correction_default",
    "prediction_default",
    "rules_that",
    "sgd_step",
]


def make_rule(name: str, size: int, num_workers: int,
              options: Mapping[str, Option] | None = None) -> Rule:
    """The rule called `name` for a shard of `size` floats shared by `num_workers` workers.

    Unknown names and options raise `ConfigError` (a `ValueError`) listing the valid ones.

    Example:
        >>> make_rule("dc-asgd", size=4, num_workers=2, options={"lambda0": 0.1}).options
        {'lambda0': 0.1}
    """
    return rule_class(name)(size, num_workers, **dict(options or {}))


def rule_class(name: str) -> type[Rule]:
    """The rule called `name`: a built-in one, or one from a notebook registered in this
    process (`nbdist.algorithms.custom`)."""
    rule = RULES.get(name) or CUSTOM.get(name)
    if rule is None:
        custom = f" (or a rule of yours: {', '.join(sorted(CUSTOM))})" if CUSTOM else ""
        raise ConfigError(f"Unknown algorithm {name!r}. Expected one of: "
                          f"{', '.join(sorted(RULES))}{custom}.")
    return rule
