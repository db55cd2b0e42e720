import pytest

from nbdist.config import Algorithm, Mode, TrainConfig, parse_names
from nbdist.errors import ConfigError


def test_strings_become_enums():
    c = TrainConfig(mode="ASYNC", algorithm="hogwild", transport="tcp")
    assert c.mode is Mode.ASYNC and c.algorithm is Algorithm.HOGWILD


def test_unknown_algorithm_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="Unknown --algorithm 'sgdx'.*'asgd', 'hogwild'"):
        TrainConfig(algorithm="sgdx")


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="Unknown --mode 'turbo'.*'async', 'sync', 'local'"):
        TrainConfig(mode="turbo")


@pytest.mark.parametrize("field,value", [("workers", 0), ("batch_size", 0), ("epochs", -1),
                                         ("servers", 0), ("batch_size", 2.5), ("epochs", True)])
def test_counts_must_be_positive_whole_numbers(field, value):
    with pytest.raises(ConfigError, match="whole number"):
        TrainConfig(**{field: value})


@pytest.mark.parametrize("lr", [0.0, -1.0, float("nan"), float("inf")])
def test_learning_rate_must_be_positive_and_finite(lr):
    with pytest.raises(ConfigError, match="--lr"):
        TrainConfig(lr=lr)


def test_data_names_parse_from_text_and_refuse_expressions():
    assert parse_names("xa, ya", "--data") == ("xa", "ya")
    assert TrainConfig(data="a,b").data == ("a", "b")
    with pytest.raises(ConfigError, match="two Python names"):
        TrainConfig(data="x[0],__import__('os')")


def test_local_mode_has_one_worker():
    with pytest.raises(ConfigError, match="one worker"):
        TrainConfig(mode="local", workers=2)


def test_to_dict_is_plain_json():
    import json

    d = TrainConfig(workers=2).to_dict()
    assert json.loads(json.dumps(d))["mode"] == "async"


def test_one_data_name_is_a_dataset_and_three_are_refused():
    assert TrainConfig(data="train_ds", validation="val_ds").data == ("train_ds",)
    assert parse_names(["val_ds"], "--validation") == ("val_ds",)
    with pytest.raises(ConfigError, match="two Python names.*or one name of a tf.data.Dataset"):
        TrainConfig(data="a,b,c")


@pytest.mark.parametrize("text,size", [("2GiB", 2 * 2**30), ("500MB", 500_000_000), ("1.5 KiB", 1536),
                                       ("0", 0), (4096, 4096), ("3b", 3)])
def test_in_memory_limit_parses_sizes(text, size):
    assert TrainConfig(in_memory_limit=text).in_memory_limit == size


@pytest.mark.parametrize("text", ["lots", "-1MB", "2 parsecs", True])
def test_in_memory_limit_refuses_what_is_not_a_size(text):
    with pytest.raises(ConfigError, match="--in-memory-limit expects a size.*Received"):
        TrainConfig(in_memory_limit=text)
