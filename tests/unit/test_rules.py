"""The rules' catalogue, stated once: each rule declares its options, their defaults and what it
can be combined with; the `--algorithm` and `--server-optimizer` enums, the config's checks and
the coordinator's plan read it."""

from types import SimpleNamespace

import pytest

from nbdist.algorithms import CAPABILITIES, RULES, rules_that
from nbdist.algorithms.group import MAX_RATIO
from nbdist.algorithms.optimizers import SERVER_OPTIMIZERS
from nbdist.algorithms.ssp import STALENESS
from nbdist.config import Algorithm, ServerOptimizer, TrainConfig
from nbdist.errors import ConfigError
from nbdist.job import coordinator_plan


def test_the_algorithm_enum_and_the_catalogue_name_the_same_rules_in_the_same_order():
    assert list(RULES) == [a.value for a in Algorithm]
    assert all(rule.name == name for name, rule in RULES.items())


def test_the_server_optimizer_enum_and_what_each_applies_are_in_step():
    assert list(SERVER_OPTIMIZERS) == list(ServerOptimizer)


@pytest.mark.parametrize("name", list(RULES))
def test_every_rule_states_each_capability_itself_not_by_inheritance(name):
    """Hogwild, SSP and Group subclass ASGD: an inherited `predicts_weights` would be a guess."""
    rule = RULES[name]
    assert [c for c in CAPABILITIES if c not in vars(rule)] == []
    assert all(isinstance(getattr(rule, c), bool) for c in CAPABILITIES)


def test_the_config_refuses_by_the_catalogue():
    assert rules_that("takes_local_steps") == ("asgd", "hogwild", "softsync", "ssp", "easgd",
                                               "diloco", "async-local-sgd", "streaming-diloco")
    for name, rule in RULES.items():
        if rule.takes_local_steps:
            assert TrainConfig(algorithm=name, local_steps=2).local_steps == 2
        else:
            with pytest.raises(ConfigError, match=f"--local-steps works with asgd, hogwild, "
                                                  f"softsync, ssp, easgd, diloco.*--algorithm "
                                                  f"{name}"):
                TrainConfig(algorithm=name, local_steps=2)
        assert TrainConfig(algorithm=name).weights_predicted is rule.predicts_weights
    assert rules_that("predicts_weights") == ("asgd", "ssp")


def test_the_coordinators_plan_takes_the_rules_own_defaults():
    contents = SimpleNamespace(num_samples=100, validation=None)

    def plan(**options):
        return coordinator_plan(TrainConfig(**options), contents, 0.1, num_workers=4)[0]

    assert plan(algorithm="ssp").staleness == STALENESS == RULES["ssp"].default_options(4)[
        "staleness"]
    assert plan(algorithm="ssp", staleness=1).staleness == 1
    assert plan(algorithm="asgd").staleness is None
    assert plan(algorithm="group").max_group_ratio == MAX_RATIO == RULES["group"].default_options(
        4)["max_ratio"]
    assert plan(algorithm="group", algo_options="max_ratio=2").max_group_ratio == 2.0
    assert plan(algorithm="group", groups=2).groups == 2


def test_who_steps_with_the_cells_optimizer_is_declared_by_the_rule():
    assert rules_that("workers_step") == ("easgd",)
    assert TrainConfig(algorithm="easgd").lr_owner == "workers"
    assert TrainConfig(algorithm="ssp").lr_owner == "hub"


def test_an_unknown_capability_is_a_programming_error():
    with pytest.raises(ValueError, match="Unknown capability 'fast'"):
        rules_that("fast")
