"""The magic passes on exactly the flags a person gave: TrainConfig alone owns the defaults.
Misuse of either magic (an unknown flag, a bad value, a flag TrainConfig refuses, no cluster)
is IPython's UsageError: one line, no traceback. `%%distribute?` shows the declared help."""

import re

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from nbdist.config import TrainConfig
from nbdist.flags import distribute_flags, given_options, nbdist_flags
from tests.helpers import SYNTHETIC_CELL


def _parse(ip, line):
    magics = ip.magics_manager.registry["NbdistMagics"]
    return given_options(parse_argstring(magics.distribute, line))


def test_a_flag_given_at_its_default_value_reaches_resume(ip, tmp_path):
    """`--resume ckpt --epochs 1` used to drop `--epochs 1`: 1 is also the flag's default, so it
    could not be told from a flag not given."""
    ip.run_cell_magic("distribute", f"--mode local --epochs 2 --checkpoint-dir {tmp_path} --wait "
                                    "--no-dashboard -o first", SYNTHETIC_CELL)
    assert ip.user_ns["first"].status == "finished"
    with pytest.raises(UsageError, match="--epochs 1 is fewer than the checkpointed run's 2"):
        ip.run_cell_magic("distribute", f"--resume {tmp_path} --epochs 1 --no-dashboard",
                          SYNTHETIC_CELL)


def test_flags_not_given_leave_every_option_to_trainconfig(ip):
    assert _parse(ip, "") == {}
    given = _parse(ip, "--epochs 1 --dbs --groups 2 --data a,b --wait -o r --top-k 2")
    assert given == {"epochs": 1, "dbs": True, "groups": 2, "data": "a,b"}
    assert TrainConfig(**given).epochs == 1


def test_magic_parses_sync_batchnorm_both_ways(ip):
    assert "sync_batchnorm" not in _parse(ip, "--mode sync")  # not given: TrainConfig decides
    assert _parse(ip, "--mode sync --sync-batchnorm")["sync_batchnorm"] is True
    assert _parse(ip, "--mode sync --no-sync-batchnorm")["sync_batchnorm"] is False


def _shown(ip, cell: str, capsys) -> tuple[object, str]:
    """Run `cell` as a notebook would; return the error it raised and what the user saw."""
    result = ip.run_cell(cell)
    captured = capsys.readouterr()
    return result.error_in_exec, captured.out + captured.err


@pytest.mark.parametrize(("cell", "message"), [
    ("%%distribute --turbo\npass", "unrecognized arguments: --turbo"),
    ("%%distribute --algorithm nope\npass", "Unknown --algorithm 'nope'. Expected one of: 'asgd'"),
    ("%%distribute --workers two\npass", "argument --workers: invalid int value: 'two'"),
    ("%%distribute --groups many\npass", "argument --groups: expects 'auto' or a whole number"),
    ("%%distribute --mode local --workers 2\npass", "--mode local trains with one worker"),
    ("%%distribute --mode local --batch-size 0\npass", r"--batch-size must be a whole number >= 1"),
    ("%%distribute --mode sync\npass", "No cluster to train on. Start one with %nbdist start 3"),
    ("%nbdist start", r"%nbdist start needs a number of engines >= 1 \(Received: None\)"),
    ("%nbdist begin 3", "argument action: invalid choice: 'begin'"),
    ("%nbdist start 2 --launcher pbs", "argument --launcher: invalid choice: 'pbs'"),
    ("%nbdist connect 3", r"%nbdist connect takes no N \(Received: 3\)\. It takes --profile, "
                          "--cluster-id, --encrypt"),
    ("%nbdist start 2 --cluster-id lab", r"%nbdist start takes no --cluster-id \(Received: "
                                         r"--cluster-id lab\)"),
    ("%nbdist status --encrypt", r"%nbdist status takes no --encrypt .* It takes nothing more"),
    ("%nbdist stop --launcher mpi",
     r"%nbdist stop takes no --launcher \(Received: --launcher mpi\)"),
])
def test_misuse_is_one_line_without_a_traceback(ip, capsys, cell, message):
    error, shown = _shown(ip, cell, capsys)
    assert isinstance(error, UsageError) and re.search(message, str(error))
    assert "Traceback" not in shown
    assert [line for line in shown.splitlines() if line.strip()] == [f"UsageError: {error}"]


def test_an_error_of_the_cell_itself_keeps_its_traceback(ip, capsys):
    """Not misuse of the magic: the cell's own mistake shows where it is, as Python shows it."""
    cell = "%%distribute --mode local --no-dashboard\nraise KeyError('mine')"
    error, shown = _shown(ip, cell, capsys)
    assert not isinstance(error, UsageError) and "KeyError" in shown and "mine" in shown


def test_the_help_is_generated_from_the_declarations(ip):
    """`%%distribute?` and `%nbdist?` show each declared flag with its help, its default and
    its modes, as docs/reference.md does."""
    magics = ip.magics_manager.registry["NbdistMagics"]
    for func, flags in ((magics.distribute, distribute_flags()), (magics.nbdist, nbdist_flags())):
        text = "".join(func.__doc__.split())  # argparse wraps lines, long words too
        for flag in flags:
            assert flag.positional or flag.spelling[-1] in text
            assert "".join(flag.help_line().split()) in text, flag.name
    docs = " ".join(magics.distribute.__doc__.split())
    assert "pipeline, the model cut into stages" in docs  # --mode's help names every mode
    assert "--encrypt" not in docs  # %nbdist start/connect takes it, %%distribute does not
