"""The magic passes on exactly the flags a person gave: TrainConfig alone owns the defaults."""

import pytest

from nbdist.config import TrainConfig
from nbdist.errors import ConfigError
from tests.conftest import SYNTHETIC_CELL


@pytest.mark.slow
def test_a_flag_given_at_its_default_value_reaches_resume(ip, tmp_path):
    """`--resume ckpt --epochs 1` used to drop `--epochs 1`: 1 is also the flag's default, so it
    could not be told from a flag not given."""
    ip.run_cell_magic("distribute", f"--mode local --epochs 2 --checkpoint-dir {tmp_path} --wait "
                                    "--no-dashboard -o first", SYNTHETIC_CELL)
    assert ip.user_ns["first"].status == "finished"
    with pytest.raises(ConfigError, match="--epochs 1 is fewer than the checkpointed run's 2"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path} --epochs 1 --no-dashboard", SYNTHETIC_CELL)


def test_flags_not_given_leave_every_option_to_trainconfig(ip):
    from IPython.core.magic_arguments import parse_argstring

    from nbdist.magic import _options

    magics = ip.magics_manager.registry["NbdistMagics"]
    assert _options(parse_argstring(magics.distribute, "")) == {}
    given = _options(parse_argstring(magics.distribute, "--epochs 1 --dbs --groups 2 --data a,b"))
    assert given == {"epochs": 1, "dbs": True, "groups": 2, "data": "a,b"}
    assert TrainConfig(**given).epochs == 1
