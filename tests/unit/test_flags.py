"""One declaration per flag: TrainConfig's fields carry their flags, and the parser, the
`nbdist.train` keywords and docs/reference.md all come from them."""

import argparse
import dataclasses
import importlib.util
from pathlib import Path

import pytest

import nbdist
from nbdist.config import Mode, TrainConfig
from nbdist.errors import ConfigError
from nbdist.flags import (
    MAGIC_FLAGS,
    add_to_parser,
    check_option_names,
    config_flags,
    distribute_flags,
    given_options,
    nbdist_flags,
)

ROOT = Path(__file__).resolve().parents[2]


def _parser(flags=None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_to_parser(parser, distribute_flags() if flags is None else flags)
    return parser


def test_every_trainconfig_field_is_a_declared_flag_and_nothing_else_is():
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [flag.name for flag in config_flags()] == fields
    assert all(flag.option for flag in config_flags())
    assert not any(flag.option for flag in MAGIC_FLAGS + nbdist_flags())
    spellings = [s for flag in distribute_flags() for s in flag.spelling]
    assert len(spellings) == len(set(spellings))


def test_a_declared_default_is_trainconfigs_default():
    defaults = TrainConfig()
    for flag in config_flags():
        if flag.name in ("data", "in_memory_limit", "algo_options", "sim"):  # parsed on the way in
            continue
        assert getattr(defaults, flag.name) == flag.default, flag.name


def test_declared_modes_and_choices_are_real():
    modes = {m.value for m in Mode}
    for flag in distribute_flags():
        assert flag.modes is None or set(flag.modes) <= modes, flag.name
        extra = ({"mode": "pipeline"} if flag.name in ("partition", "schedule")
                 else {"mode": "sync"} if flag.name == "collective" else {})
        for choice in flag.choice_values or ():
            if flag.option:  # every choice offered is one TrainConfig takes
                more = {"workers": 1} if choice == "simulate" else {}
                config = TrainConfig(**extra, **more, **{flag.name: choice})
                assert getattr(config, flag.name) == choice


def test_a_flag_given_at_its_default_is_told_from_one_not_given():
    parser = _parser()
    assert given_options(parser.parse_args([])) == {}
    given = given_options(parser.parse_args(["--epochs", "1", "--mode", "async"]))
    assert given == {"epochs": 1, "mode": "async"}
    args = parser.parse_args(["--algo-opt", "lambda0=2", "--groups", "auto", "--no-validation",
                              "-o", "r"])
    assert given_options(args) == {"algo_options": "lambda0=2", "groups": "auto",
                                   "no_validation": True}
    assert (args.output, args.wait, args.resume) == ("r", False, None)  # the magic's own: defaults


@pytest.mark.parametrize("line", [["--groups", "three"], ["--workers", "2.5"], ["--mode", "fast"]])
def test_the_parser_refuses_what_the_declaration_does_not_take(line):
    with pytest.raises(argparse.ArgumentError):
        _parser().parse_args(line)


LINES = [  # between them, every training flag of %%distribute
    "--mode async --algorithm ssp --workers 2 --servers 2 --epochs 3 --batch-size 64 --lr 0.1 "
    "--model m --data a,b --validation c,d --in-memory-limit 500MB --no-validation --seed 4 "
    "--transport tcp --compression fp16 --timeout 30 --algo-opt staleness=2 --staleness-lr "
    "--groups 2 --metrics minimal --pin auto --spin off --dbs --batch-min 8 --batch-max 128 "
    "--slowdown 1,2 --elastic --checkpoint-dir ck --checkpoint-every 5",
    "--algorithm ssp --staleness 2 --overlap --pause-at 0 --predict-weights --momentum-correction "
    "--precise-bn --average-tail 0.2",
    "--algorithm softsync --n 2 --local-steps 2 --server-optimizer adam",
    "--mode sync --sync-batchnorm --collective torch",
    "--mode simulate --workers 2 --sim jitter=0.1,sync=1",
    "--mode pipeline --stages 3 --micro-batches 2 --partition greedy --schedule 1f1b",
]


def test_every_flag_parses_into_a_value_trainconfig_takes():
    seen = set()
    for line in LINES:
        given = given_options(_parser().parse_args(line.split()))
        config = TrainConfig(**given)
        seen |= set(given)
        if "--slowdown" in line:
            assert (config.workers, config.batch_size, config.data) == (2, 64, ("a", "b"))
            assert config.slowdown == (1.0, 2.0)
            assert config.in_memory_limit == 500_000_000 and config.checkpoint_interval == 5.0
    assert seen == {flag.name for flag in config_flags()}


def test_train_refuses_an_unknown_option_naming_the_close_ones():
    with pytest.raises(ConfigError, match=r"Unknown training option 'epohcs' \(Received: "
                                          r"epohcs\). Did you mean epochs\?"):
        nbdist.train("pass", epohcs=2)
    with pytest.raises(ConfigError, match=r"top_k is a display flag of the %%distribute magic"):
        nbdist.train("pass", top_k=2)
    with pytest.raises(ConfigError, match=r"nbdist.resume\(path, cell, ...\)"):
        nbdist.train("pass", resume="ckpt")
    with pytest.raises(ConfigError, match=r"Expected one of TrainConfig's fields: mode, algorithm"):
        check_option_names(["zzz"])
    with pytest.raises(ConfigError, match="Did you mean batch_size"):
        nbdist.train("pass", config=TrainConfig(), batchsize=3)
    check_option_names([f.name for f in dataclasses.fields(TrainConfig)])  # every field is accepted


def test_defaults_live_once():
    """The dead copies are gone; the ones in use are read from their single home."""
    from nbdist.checkpoint import store
    from nbdist.cluster import affinity
    from nbdist.core.simclock import SimOptions, sim_options
    from nbdist.engine import data

    assert not hasattr(store, "DEFAULT_EVERY_S") and not hasattr(data, "DEFAULT_IN_MEMORY_LIMIT")
    assert not hasattr(affinity, "PIN_CHOICES")
    assert sim_options({}) == SimOptions()
    sim = next(f for f in config_flags() if f.name == "sim")
    assert sim.shown == ("per_step=0.001,per_sample=2e-05,per_push=0,jitter=0,calibrate=0,"
                         "eval_every=0,sync=0,"
                         "bandwidth=0,latency=0")


def _gen_reference():
    path = ROOT / "scripts" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_reference_is_generated_from_the_declarations():
    """Fails when a flag or switch changed and docs/reference.md was not regenerated:
    run `python scripts/gen_reference.py`."""
    assert (ROOT / "docs" / "reference.md").read_text() == _gen_reference().render()


def test_the_reference_has_one_line_per_flag_of_both_magics_and_per_switch():
    from nbdist.env import SWITCHES

    lines = _gen_reference().render().splitlines()
    for flag in distribute_flags() + nbdist_flags():
        assert sum(line.startswith(f"| `{flag.spelling[0]}`") for line in lines) == 1, flag.name
    for name in SWITCHES:
        assert sum(line.startswith(f"| `{name}`") for line in lines) == 1, name
