"""The weights of a run whose hub shards hold them (async on engines, local in this kernel):
the final and current parameters and a checkpoint's state are read from the shards through
the kernel's control line, the same way in both modes."""

from __future__ import annotations

import numpy as np

from nbdist.fit.optimizer_state import OptimizerState, shard_slots


class HubShardWeights:
    """Backend mixin: the run's weights and checkpoint state come from its hub shards."""

    def final_params(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The trained flat parameters and non-trainable state (from the hub shards)."""
        return control.params()

    def current_weights(self, control) -> tuple[np.ndarray, np.ndarray]:
        """The hub shards' weights now, while the workers train."""
        return control.params()

    def checkpoint_state(self, control, final: bool) -> list:
        """Every hub shard's state, for a checkpoint (nbdist.checkpoint.store)."""
        return control.state()

    def optimizer_state(self, control, final: bool) -> OptimizerState | None:
        """The hub shards' slots now; at the run's end, none (the run's monitor kept the
        shards' state at the last epoch's end)."""
        return None if final else shard_slots(self.checkpoint_state(control, False))
