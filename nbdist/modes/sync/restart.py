"""What a `--mode sync` run restarted on the ranks left starts from (pure).

When a rank's engine dies, the other ranks' next collective fails; each returns its state
instead of raising (nbdist.modes.sync.rank): the weights, optimizer slots and data position of
the last step it applied. An update is applied only once its allreduce has returned, so that
step is whole on every rank, and the ranks left hold the same state (a rank may be one step
ahead if the dead rank's last contribution reached it and not the others: the most advanced
state is taken). The kernel (nbdist.modes.sync.backend) then starts one rank per engine left,
from that state, through a new rendezvous, with the global batch shared among them.
"""

from __future__ import annotations


def latest_state(stranded: dict[int, dict]) -> tuple[int, dict]:
    """(worker, state) of the rank that applied the most steps; the lowest worker id on a tie.

    Example:
        >>> latest_state({0: {"steps": 7}, 2: {"steps": 8}, 3: {"steps": 8}})
        (2, {'steps': 8})
    """
    worker = min(stranded, key=lambda w: (-int(stranded[w]["steps"]), w))
    return worker, stranded[worker]


def start_at(position: tuple[int, int], epoch_size: int) -> tuple[int, int]:
    """Where the restarted ranks begin: (epoch, samples of it done). A rank stranded right after
    an epoch's last step had already ended that epoch (reported it, validated), so the ranks
    begin the next one.

    Example:
        >>> start_at((2, 384), 900), start_at((2, 900), 900)
        ((2, 384), (3, 0))
    """
    epoch, offset = int(position[0]), int(position[1])
    return (epoch + 1, 0) if offset >= epoch_size else (epoch, offset)


def rank_batch(global_batch: int, ranks: int, low: int = 1,
               high: int | None = None) -> tuple[int, str | None]:
    """Each restarted rank's batch, so that the ranks left train on the run's global batch (the
    gradient and the learning rate mean what they meant), within `--batch-min`/`--batch-max`
    (`low`, `high`), and a warning when they cannot share it exactly.

    Example:
        >>> rank_batch(48, 2), rank_batch(32, 3)[0], rank_batch(48, 2, high=16)[0]
        ((24, None), 10, 16)
    """
    each = max(1, low, global_batch // ranks)
    each = min(each, high) if high is not None else each
    if each * ranks == global_batch:
        return each, None
    return each, (f"the {ranks} ranks left share the run's global batch of {global_batch} as "
                  f"{each} samples each, so each step trains on {each * ranks} samples, not "
                  f"{global_batch}" + (f" (--batch-max {high})" if each == high else ""))
