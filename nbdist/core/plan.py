"""The parts of a run's configuration that the shard core and the coordinator act on."""

from __future__ import annotations

from dataclasses import dataclass, field

from nbdist.algorithms import rule_class
from nbdist.algorithms.group import MAX_RATIO


@dataclass
class Plan:
    """The parts of the run's configuration the coordinator acts on. `num_workers` is the
    configured M, fixed for the run: workers added mid-run (`Coordinator.add_worker`) do not
    change what depends on it (softsync's c, EASGD's α, the start barrier)."""

    num_workers: int
    num_samples: int
    epochs: int
    batch_size: int
    lr: float | None  # the workers' rate when they own it (lr_owner); None: their own schedule
    has_validation: bool
    algorithm: str = "asgd"
    staleness: int | None = None  # ssp: S
    groups: int = 0  # group: 0 = automatic from speeds, else that many groups
    max_group_ratio: float = MAX_RATIO
    chunks_ahead: int = 1  # chunks a worker may hold: local steps or overlap need more
    local_steps: int = 1  # steps a worker takes between exchanges (> 1: it pushes deltas)
    overlap: bool = False  # workers push step t while computing t+1: a push may be one read behind
    dbs: bool = False
    batch_min: int = 1
    batch_max: int | None = None
    slowdown: list[float] = field(default_factory=list)
    staleness_lr: bool = False
    predict_weights: bool = False  # pulls carry w + d x (last update), d the worker's delay
    # the optimizer's momentum lowered by what asynchrony adds (nbdist.algorithms.momentum)
    momentum_correction: bool = False
    # the share of the run's samples over whose updates the weights handed back are averaged
    # (nbdist.core.tail_average); 0: the last update's weights
    average_tail: float = 0.0
    metrics: str = "full"  # "minimal": counters only, no history rows or timeline
    # who applies the learning rate, so only one place holds it: "hub" (the hub optimizer,
    # nbdist.core.updater) or "workers" (sync ranks, --local-steps and easgd workers, which the
    # coordinator tells the rate on every reply)
    lr_owner: str = "hub"
    pause_at: int | None = None  # --pause-at: the coordinator pauses itself after this many steps
    silence_is_loss: bool = True  # write off the silent (not in sync: Horovod fails a hung rank)
    # a cell's fit call: each epoch starts once the kernel ran its callbacks
    epoch_gate: bool = False

    @property
    def syncs_groups(self) -> bool:
        """Whether the rule holds a group's pushes at a barrier and applies their mean (group,
        diloco)."""
        return rule_class(self.algorithm).syncs_groups

    @property
    def shares_rounds(self) -> bool:
        """Whether a worker's round of local steps takes at most its share of an epoch: in a
        synchronous group (group, diloco), or where the rule says so (async-local-sgd)."""
        rule = rule_class(self.algorithm)
        return rule.syncs_groups or rule.shares_rounds
