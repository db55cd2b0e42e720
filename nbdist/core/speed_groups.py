"""Group sync's speed groups, kept by the coordinator: who steps with whom, and the options
that shape them (`max_ratio`, `wanted`), which the coordinator owns and the rule only
validates. Pure: formed from the throughputs it is given (`algorithms.group.form_groups`)."""

from __future__ import annotations

from nbdist.algorithms.group import form_groups
from nbdist.core.plan import Plan


class SpeedGroups:
    """Each worker's group (`of[w]`: its members, sorted); every worker alone until `form`,
    except with one group or one per worker, which need no measurement (`formed` at once)."""

    def __init__(self, plan: Plan):
        n = plan.num_workers
        # wanted 0: as max_ratio needs
        self.max_ratio, self.wanted = plan.max_group_ratio, plan.groups
        self.of: list[list[int]] = [[w] for w in range(n)]
        self.formed = False
        if plan.syncs_groups and plan.groups in (1, n):
            self.of = [list(range(n)) if plan.groups == 1 else [w] for w in range(n)]
            self.formed = True

    def add(self, worker: int) -> None:
        """A worker added mid-run: alone until the next `form`."""
        self.of.append([worker])

    def form(self, active: list[int], rates: list[float]) -> list[list[int]]:
        """Group the `active` workers by their samples per second `rates`; returns the groups.

        Example:
            >>> plan = Plan(num_workers=3, num_samples=9, epochs=1, batch_size=1, lr=0.1,
            ...             has_validation=False)
            >>> g = SpeedGroups(plan)
            >>> g.form([0, 1, 2], [100.0, 110.0, 900.0]), g.of
            ([[0, 1], [2]], [[0, 1], [0, 1], [2]])
        """
        wanted = min(self.wanted, len(active)) if self.wanted else None
        groups = [sorted(active[i] for i in g)
                  for g in form_groups([max(r, 1e-9) for r in rates], self.max_ratio, wanted)]
        for members in groups:
            for w in members:
                self.of[w] = members
        self.formed = True
        return groups

    def index(self, worker: int) -> int:
        """The group's number on the dashboard: its smallest member."""
        return min(self.of[worker])
