import pytest

from nbdist.config import Algorithm, Mode, TrainConfig
from nbdist.errors import ConfigError
from nbdist.flag_values import parse_names


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
                                         ("servers", 0), ("batch_size", 2.5), ("epochs", True),
                                         ("pause_at", -1)])
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


@pytest.mark.parametrize("text,size", [("2GiB", 2 * 2**30), ("500MB", 500_000_000),
                                       ("1.5 KiB", 1536), ("0", 0), (4096, 4096), ("3b", 3)])
def test_in_memory_limit_parses_sizes(text, size):
    assert TrainConfig(in_memory_limit=text).in_memory_limit == size


@pytest.mark.parametrize("text", ["lots", "-1MB", "2 parsecs", True])
def test_in_memory_limit_refuses_what_is_not_a_size(text):
    with pytest.raises(ConfigError, match="--in-memory-limit expects a size.*Received"):
        TrainConfig(in_memory_limit=text)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["timeout", "lr", "checkpoint_every", "epochs", "batch_size",
                                   "servers", "workers", "seed", "staleness", "n", "local_steps",
                                   "batch_min", "batch_max"])
def test_non_finite_numbers_are_refused_everywhere(field, bad):
    extra = {"checkpoint_dir": "ckpt"} if field == "checkpoint_every" else {}
    extra.update({"algorithm": "ssp"} if field == "staleness"
                 else {"algorithm": "softsync"} if field == "n" else {})
    with pytest.raises(ConfigError, match=r"Received: (nan|inf|-inf)"):
        TrainConfig(**{field: bad}, **extra)


@pytest.mark.parametrize("text", ["lambda0=nan", "momentum=inf"])
def test_non_finite_rule_options_sim_and_slowdown_are_refused(text):
    with pytest.raises(ConfigError, match="must be a finite number"):
        TrainConfig(algorithm="ddc-asgd", algo_options=text)
    with pytest.raises(ConfigError, match="--slowdown factors"):
        TrainConfig(slowdown="1,nan")
    with pytest.raises(ConfigError, match="--sim jitter"):
        TrainConfig(mode="simulate", workers=2, sim="jitter=nan")


def test_timeout_must_be_a_number():
    with pytest.raises(ConfigError, match=r"--timeout must be a positive finite number of seconds "
                                          r"\(Received: '5'\)"):
        TrainConfig(timeout="5")


def test_encrypt_refuses_a_cluster_without_curvezmq():
    from nbdist.cluster.engines import require_curve
    from nbdist.errors import ClusterError

    class Plain:
        curve_serverkey = None
        closed = False

        def close(self):
            self.closed = True

    client = Plain()
    with pytest.raises(ClusterError, match=r"does not use CurveZMQ \(Received: no curve_serverkey"
                                           r".*enable_curve=True"):
        require_curve(client, True, "profile='p'")
    assert client.closed
    require_curve(Plain(), False, "profile='p'")  # without --encrypt any cluster will do


# -- refused before any engine is asked (moved from the cluster tests, which need none) ---------


def test_unknown_algo_option_is_refused_before_anything_starts():
    with pytest.raises(ConfigError,
                       match="Unknown option 'lamda' for dc-asgd. Valid: lambda0=0.04"):
        TrainConfig(algorithm="dc-asgd", algo_options="lamda=1")


def test_sync_rejects_parameter_server_options():
    with pytest.raises(ConfigError, match="no parameter server"):
        TrainConfig(mode="sync", servers=2)


def test_sync_without_horovod_says_how_to_install_it(monkeypatch):
    import builtins

    from nbdist.errors import DependencyError
    from nbdist.modes.sync.backend import require_horovod

    real_import = builtins.__import__

    def no_horovod(name, *args, **kwargs):
        if name.startswith("horovod"):
            raise ImportError("No module named 'horovod'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_horovod)
    with pytest.raises(DependencyError, match="make horovod"):
        require_horovod()


def test_sync_batchnorm_is_opt_in_and_refused_outside_sync_mode():
    assert not TrainConfig(mode="sync").batchnorm_synced
    assert TrainConfig(mode="sync", sync_batchnorm=True).batchnorm_synced
    assert not TrainConfig(mode="sync", sync_batchnorm=False).batchnorm_synced
    assert not TrainConfig(mode="async").batchnorm_synced
    with pytest.raises(ConfigError, match="--sync-batchnorm does not apply to --mode async.*"
                       "--sync-batchnorm works with --mode sync. Drop the flag"):
        TrainConfig(mode="async", sync_batchnorm=True)


def test_unknown_launcher_is_refused_with_the_choices():
    from nbdist.cluster.engines import Cluster
    from nbdist.errors import NoClusterError

    with pytest.raises(NoClusterError,
                       match=r"Unknown launcher \(Received: 'pbs'\).*local, slurm, mpi"):
        Cluster.start(2, launcher="pbs")


@pytest.mark.parametrize("factor", [0, -1, 1e9, float("inf")])
def test_absurd_live_slowdown_is_refused_in_the_kernel(factor):
    from nbdist.run.handle import Run

    with pytest.raises(ConfigError, match="--slowdown factors must be between 1"):
        Run(TrainConfig(), model=None, model_name="model").set_slowdown(0, factor)
