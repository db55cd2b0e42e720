"""The magic passes on exactly the flags a person gave: TrainConfig alone owns the defaults;
flags it cannot parse, and a magic without a cluster, are refused with what to do."""

import pytest

from nbdist.config import TrainConfig
from nbdist.errors import ConfigError, NoClusterError
from tests.helpers import SYNTHETIC_CELL


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


def test_magic_without_a_cluster_says_how_to_start_one(ip):
    with pytest.raises(NoClusterError, match="%nbdist start"):
        ip.run_cell_magic("distribute", "--wait", SYNTHETIC_CELL)


def test_unknown_flag_and_algorithm_are_usage_errors(ip):
    from IPython.core.error import UsageError

    for line in ("--algorithm nope", "--turbo"):
        with pytest.raises(UsageError):
            ip.run_cell_magic("distribute", line, SYNTHETIC_CELL)


def test_magic_parses_sync_batchnorm_both_ways(ip):
    from IPython.core.magic_arguments import parse_argstring

    from nbdist.magic import _options

    magics = ip.magics_manager.registry["NbdistMagics"]

    def parse(line):
        return _options(parse_argstring(magics.distribute, line))

    assert "sync_batchnorm" not in parse("--mode sync")  # not given: TrainConfig decides
    assert parse("--mode sync --sync-batchnorm")["sync_batchnorm"] is True
    assert parse("--mode sync --no-sync-batchnorm")["sync_batchnorm"] is False
