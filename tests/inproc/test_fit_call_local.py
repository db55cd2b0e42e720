"""A cell's own `model.fit(...)` call, distributed in this kernel (--mode local): the call is the
run's specification, Keras's training loop never runs, the History and the callbacks behave as
with `fit`, and what nbdist cannot honour is refused before anything trains."""

import contextlib
import io
import os

import numpy as np
import pytest

import nbdist
from nbdist.errors import CellError, CheckpointError, NonFiniteLossError
from tests.helpers import SYNTHETIC_CELL, TRANSFER_CELL, check_transfer_cell


def fit_cell(fit_line: str, before: str = "") -> str:
    """The synthetic cell, ending with its own fit call (and what the test adds before it)."""
    return (SYNTHETIC_CELL + before + fit_line
            + "\nscore = model.evaluate(x_test, y_test, verbose=0)\n")


def train_locally(cell: str, **options):
    import keras

    keras.utils.set_random_seed(0)
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run = nbdist.train(cell, namespace=ns, mode="local", **options)
    return run, ns, out.getvalue()


def event_rows(run, name: str) -> list[dict]:
    events = run.events
    if "event" not in events:
        return []
    return events[events["event"] == name].to_dict("records")


def test_the_fit_call_trains_distributed_and_returns_keras_history():
    cell = fit_cell("history = model.fit(x_train, y_train, batch_size=32, epochs=3, "
                    "validation_split=0.1)")
    run, ns, out = train_locally(cell)
    history = ns["history"]
    assert run.status == "finished" and run.keras_history is history
    assert run.result(timeout=30) is history  # the run's result: the History its call returned
    assert history.epoch == [0, 1, 2]
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 3 for v in history.history.values())
    assert history.history["loss"][2] < history.history["loss"][0]
    validated = run.history.dropna(subset=["val_accuracy"])  # the last epoch's too (after the end)
    assert validated["epoch"].tolist() == [0, 1, 2]
    assert validated["val_accuracy"].tolist() == pytest.approx(history.history["val_accuracy"])
    assert ns["model"].train_function is None  # Keras's own training loop never ran
    assert ns["score"][1] > 0.8  # the statements after the call ran on the trained model
    assert "Epoch 3/3" in out and "━" not in out  # a line per epoch, no Keras progress bar
    assert run.config.epochs == 3 and run.config.batch_size == 32
    assert not any(k.startswith("_nbdist") for k in ns)  # nbdist's own names are gone


def test_validation_is_what_model_evaluate_gives_on_the_same_weights():
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=2, validation_split=0.2)")
    _, ns, _ = train_locally(cell)
    n = len(ns["x_train"])
    held = int(np.floor(n * 0.8))  # Keras's validation_split: the last 20 %, before shuffling
    again = ns["model"].evaluate(ns["x_train"][held:], ns["y_train"][held:], verbose=0,
                                 return_dict=True)
    assert ns["history"].history["val_loss"][-1] == pytest.approx(again["loss"], rel=1e-5)
    assert ns["history"].history["val_accuracy"][-1] == pytest.approx(again["accuracy"], abs=1e-6)


VALIDATION_BATCHES = """
class Held(keras.utils.PyDataset):  # keras.io's way: batches by index
    def __len__(self):
        return 3
    def __getitem__(self, i):
        return x_test[i * 50:(i + 1) * 50], y_test[i * 50:(i + 1) * 50]
"""


@pytest.mark.parametrize("validation_data", [
    "Held()",  # a keras.utils.PyDataset
    "((x_test[i:i + 50], y_test[i:i + 50]) for i in range(0, 150, 50))",  # a generator
])
def test_a_py_dataset_or_a_generator_as_validation_data_validates_as_keras_does(validation_data):
    """Keras takes both as validation_data (nbdist refused them: "must be (x_val, y_val) ...
    or a tf.data.Dataset"); their batches are read once and each epoch validates on them."""
    cell = fit_cell(f"history = model.fit(x_train, y_train, epochs=2, "
                    f"validation_data={validation_data})", before=VALIDATION_BATCHES)
    run, ns, _ = train_locally(cell)
    assert run.status == "finished", run.error
    again = ns["model"].evaluate(ns["x_test"][:150], ns["y_test"][:150], verbose=0,
                                 return_dict=True)
    assert len(ns["history"].history["val_loss"]) == 2
    assert ns["history"].history["val_loss"][-1] == pytest.approx(again["loss"], rel=1e-5)


def test_flags_on_the_magic_line_override_the_call_and_the_notes_say_so():
    cell = fit_cell("history = model.fit(x_train, y_train, batch_size=32, epochs=3)")
    run, ns, _ = train_locally(cell, epochs=1, batch_size=16)
    assert ns["history"].epoch == [0] and run.config.batch_size == 16
    notes = [e["text"] for e in event_rows(run, "note")]
    assert "--epochs 1 on the magic line overrides model.fit(epochs=3)." in notes
    assert "--batch-size 16 on the magic line overrides model.fit(batch_size=32)." in notes


def test_initial_epoch_shuffle_and_steps_per_epoch_are_honoured():
    cell = fit_cell("history = model.fit(x_train, y_train, batch_size=30, epochs=3, "
                    "initial_epoch=1, shuffle=False, steps_per_epoch=10)")
    run, ns, _ = train_locally(cell)
    assert ns["history"].epoch == [1, 2]
    assert run.stats["epoch_samples"] == [300, 300]  # 10 steps of 30 per epoch
    assert run.stats["global_step"] == 20


@pytest.mark.slow
def test_early_stopping_restores_the_best_epochs_weights():
    seen = """
class Seen(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights, self.val = [], []
    def on_epoch_end(self, epoch, logs=None):
        self.weights.append([w.copy() for w in self.model.get_weights()])
        self.val.append(logs["val_loss"])
seen = Seen()
"""
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=6, validation_split=0.2, "
                    "callbacks=[seen, keras.callbacks.EarlyStopping(monitor='val_loss', "
                    "patience=100, restore_best_weights=True)])",
                    before=seen.replace("\nseen = Seen()", "\nseen = Seen()\n"
                                        "model.optimizer.learning_rate.assign(2.0)"))
    _, ns, _ = train_locally(cell)
    val = ns["seen"].val
    best = int(np.argmin(val))
    assert len(val) == 6 and best != 5, val  # at 2.0 the validation loss is not monotonic
    for got, want in zip(ns["model"].get_weights(), ns["seen"].weights[best], strict=True):
        np.testing.assert_array_equal(got, want)


def test_early_stopping_stops_the_run_and_keeps_the_epochs_weights():
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=30, validation_split=0.2, "
                    "callbacks=[keras.callbacks.EarlyStopping(monitor='val_loss', min_delta=10, "
                    "patience=1)])")
    run, ns, _ = train_locally(cell)
    assert ns["history"].epoch == [0, 1] and run.status == "stopped"
    # the epoch gate: nothing of epoch 3 trained
    assert run.stats["epochs_done"] == pytest.approx(2.0)


@pytest.mark.slow
def test_reduce_lr_on_plateau_and_learning_rate_scheduler_act_on_the_runs_rate():
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=3, validation_split=0.2, "
                    "callbacks=[keras.callbacks.ReduceLROnPlateau(monitor='val_loss', "
                    "min_delta=10, factor=0.5, patience=0)])")
    run, _, _ = train_locally(cell)
    rates = [e["lr"] for e in event_rows(run, "set_lr")]
    # after epoch 1 (epoch 0 set the best); the last trains nothing
    assert rates == pytest.approx([0.05])
    assert all("ReduceLROnPlateau" in e["by"] for e in event_rows(run, "set_lr"))
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=3, callbacks=["
                    "keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.2 / (epoch + 1))])")
    run, ns, _ = train_locally(cell)
    sets = event_rows(run, "set_lr")
    assert [e["lr"] for e in sets] == pytest.approx([0.2, 0.1, 0.2 / 3])
    ends = event_rows(run, "epoch_end")
    # each epoch's rate is set before it trains: no push between its predecessor's end and the rate
    assert [e["step"] for e in sets] == [0, ends[0]["step"] + 1, ends[1]["step"] + 1]
    assert ns["history"].history["learning_rate"] == pytest.approx([0.2, 0.1, 0.2 / 3])


def test_checkpoints_csv_logs_tensorboard_and_lambda_callbacks_see_every_epoch(tmp_path):
    calls = []
    cell = fit_cell(
        "history = model.fit(x_train, y_train, epochs=3, validation_split=0.2, callbacks=[\n"
        f"  keras.callbacks.ModelCheckpoint({str(tmp_path / 'best.weights.h5')!r}, "
        "save_best_only=True, save_weights_only=True),\n"
        f"  keras.callbacks.ModelCheckpoint({str(tmp_path)!r} + '/model-{{epoch}}.keras'),\n"
        f"  keras.callbacks.CSVLogger({str(tmp_path / 'log.csv')!r}),\n"
        f"  keras.callbacks.TensorBoard({str(tmp_path / 'tb')!r}),\n"
        "  keras.callbacks.LambdaCallback(on_train_begin=lambda logs: calls.append('begin'),\n"
        "    on_epoch_end=lambda epoch, logs: calls.append(epoch),\n"
        "    on_train_end=lambda logs: calls.append('end'))])")
    import keras

    ns = {"calls": calls}  # a list from an earlier cell, as a notebook would have it
    keras.utils.set_random_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        nbdist.train(cell, namespace=ns, mode="local")
    assert calls == ["begin", 0, 1, 2, "end"]
    assert (sorted(p.name for p in tmp_path.glob("model-*.keras"))
            == ["model-1.keras", "model-2.keras", "model-3.keras"])
    final = keras.models.load_model(tmp_path / "model-3.keras")
    for got, want in zip(final.get_weights(), ns["model"].get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert (rows[0].split(",")[:2] == ["epoch", "accuracy"] and len(rows) == 4
            and "val_loss" in rows[0])
    assert (tmp_path / "best.weights.h5").exists()
    assert (any(os.scandir(tmp_path / "tb" / "train"))
            and any(os.scandir(tmp_path / "tb" / "validation")))


def test_terminate_on_nan_ends_the_fit_as_in_keras_and_without_it_the_error_is_raised():
    diverge = "model.optimizer.learning_rate.assign(1e9)\n"
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=3, "
                    "callbacks=[keras.callbacks.TerminateOnNaN()])", before=diverge)
    run, ns, out = train_locally(cell)
    assert "Invalid loss, terminating training" in out and ns["history"].epoch in ([], [0], [0, 1])
    with pytest.raises(NonFiniteLossError, match="became nan|became inf"):
        train_locally(fit_cell("model.fit(x_train, y_train, epochs=3)", before=diverge))


def test_batch_level_callbacks_are_called_at_a_cadence_with_the_steps_so_far():
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=2, batch_size=8, "
                    "callbacks=[batches])",
                    before="""
class Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []
    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((batch, logs["loss"]))
batches = Batches()
""")
    _, ns, _ = train_locally(cell)
    seen = ns["batches"].seen
    assert seen and all(np.isfinite(loss) for _, loss in seen)
    assert all(0 <= b < 113 for b, _ in seen)  # steps of one epoch: 900 samples at 8


def test_several_inputs_and_outputs_with_sample_weights_train_and_log_per_output():
    cell = """
import numpy as np
import keras
from nbdist.datasets import make_synthetic
(x, y), _ = make_synthetic(n=800, shape=(8,), classes=3, seed=1)
a, b = x[:, :5], x[:, 5:]
weights = np.where(y == 0, 2.0, 1.0).astype("float32")
ia, ib = keras.Input((5,), name="a"), keras.Input((3,), name="b")
h = keras.layers.Dense(16, activation="relu")(keras.layers.concatenate([ia, ib]))
model = keras.Model({"a": ia, "b": ib}, [keras.layers.Dense(3, activation="softmax", name="cls")(h),
                                          keras.layers.Dense(1, name="reg")(h)])
model.compile(optimizer="adam", loss=["sparse_categorical_crossentropy", "mse"],
              loss_weights=[1.0, 0.1], metrics=[["accuracy"], ["mae"]])
history = model.fit({"a": a, "b": b}, [y, x.sum(axis=1, keepdims=True)], sample_weight=weights,
                    epochs=2, batch_size=16, validation_split=0.25)
"""
    run, ns, _ = train_locally(cell)
    assert run.status == "finished"
    keys = set(ns["history"].history)
    assert {"loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae", "val_cls_accuracy",
            "val_reg_mae"} <= keys


def test_class_weight_weighs_the_loss_as_keras_does():
    weighted, _, _ = train_locally(
        fit_cell("model.fit(x_train, y_train, epochs=1, class_weight={0: 10.0})"))
    plain, _, _ = train_locally(fit_cell("model.fit(x_train, y_train, epochs=1)"))
    # the same seed: the same initial weights and first batch, whose class-0 samples weigh 10
    first = weighted.history["loss"].iloc[0] / plain.history["loss"].iloc[0]
    assert first > 1.5


def test_simulate_mode_takes_the_fit_call_too():
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=2, batch_size=32, "
                    "validation_split=0.1)")
    import keras

    keras.utils.set_random_seed(0)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        run = nbdist.train(cell, namespace=ns, mode="simulate", workers=2)
    assert run.status == "finished" and ns["history"].epoch == [0, 1] and ns["score"][1] > 0.8


@pytest.mark.parametrize(("fit_line", "error", "message"), [
    ("model.train_on_batch(x_train[:8], y_train[:8])", CellError, "train_on_batch"),
    ("model.fit((b for b in []), epochs=1)", CellError, "yields no batch"),
    ("model.fit(x_train, epochs=1)", CellError, "got inputs but no labels"),
])
def test_what_cannot_be_distributed_is_refused_before_anything_trains(fit_line, error, message):
    with pytest.raises(error, match=message):
        train_locally(fit_cell(fit_line))


def test_the_magic_binds_the_run_and_the_cell_goes_on_after_its_fit_call(ip, capsys):
    import keras

    keras.utils.set_random_seed(0)
    cell = fit_cell("history = model.fit(x_train, y_train, epochs=2, verbose=2)") + "done = True\n"
    ip.run_cell_magic("distribute", "--mode local -o r", cell)
    ns = ip.user_ns
    assert isinstance(ns["history"], keras.callbacks.History) and ns["history"].epoch == [0, 1]
    assert ns["r"].status == "finished" and ns["r"].keras_history is ns["history"]
    assert ns["done"] is True and ns["model"].train_function is None
    out = capsys.readouterr().out
    assert "Epoch 1/2" in out and "Epoch 2/2" in out  # no dashboard here: a line per epoch


def test_a_generator_or_a_py_dataset_is_read_once_and_replayed_each_epoch():
    gen = fit_cell("history = model.fit(((x_train[i:i + 30], y_train[i:i + 30]) "
                   "for i in range(0, 900, 30)), epochs=2, steps_per_epoch=20)")
    run, ns, _ = train_locally(gen)
    assert ns["history"].epoch == [0, 1] and run.stats["epoch_samples"] == [600, 600]
    assert "read 20 batch(es) of it once" in run.warnings[0]
    py_dataset = fit_cell("history = model.fit(Batches(), epochs=1)", before="""
class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 9
    def __getitem__(self, i):
        return x_train[i * 100:(i + 1) * 100], y_train[i * 100:(i + 1) * 100]
""")
    run, ns, _ = train_locally(py_dataset)
    assert run.stats["epoch_samples"] == [900] and run.config.batch_size == 100  # its own batches


@pytest.mark.parametrize("mode", ["local", "simulate"])
def test_two_fit_calls_train_as_two_runs_with_each_compile_and_trainable_flags(mode):
    """keras.io's transfer learning: the top with the base frozen, then the whole model at a low
    rate. Each call is a run of its own; the code between them runs here on the trained model."""
    import keras

    keras.utils.set_random_seed(0)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        run = nbdist.train(TRANSFER_CELL, namespace=ns, mode=mode,
                           **({"workers": 2} if mode == "simulate" else {}))
    check_transfer_cell(ns)
    assert run.status == "finished" and run.keras_history is ns["tuned"]  # the last call's run
    assert run.config.epochs == 2


def test_resume_continues_the_fit_call_its_checkpoint_was_taken_in(tmp_path):
    import json

    import keras

    keras.utils.set_random_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        nbdist.train(TRANSFER_CELL, namespace={}, mode="local", checkpoint_dir=str(tmp_path))
    with open(tmp_path / "meta.json") as f:
        assert json.load(f)["fit_call"] == 1  # the last checkpoint: the second call's run
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run = nbdist.resume(tmp_path, TRANSFER_CELL, namespace=ns, mode="local", epochs=3)
    assert "fit call 1 does not train again: --resume continues its fit call 2" in out.getvalue()
    assert ns["top"].epoch == [] and ns["tuned"].epoch == [2]  # only the epoch left to train
    assert run.status == "finished" and run.nodes["samples"].sum() == 810  # 900 less the split
    assert ns["score"][1] > 0.85
    one_call = TRANSFER_CELL.split("base_model.trainable = True")[0]  # the cell, edited since
    edited = "taken by the cell's fit call 2, but the cell makes 1 fit call"
    with pytest.raises(CheckpointError, match=edited), contextlib.redirect_stdout(io.StringIO()):
        nbdist.resume(tmp_path, one_call, namespace={}, mode="local")


def test_model_checkpoint_saves_the_optimizer_state_as_keras_own_does(tmp_path):
    """ModelCheckpoint(save_weights_only=False) saves Adam's moments and step count as the hub
    holds them, so load_model then fit goes on from them, as after Keras's own checkpoint."""
    import json
    import warnings

    import keras

    def cell(where):
        return fit_cell(f"model.fit(x_train, y_train, epochs=2, batch_size=32, callbacks=["
                        f"keras.callbacks.ModelCheckpoint({str(where)!r})])").replace(
            "keras.optimizers.SGD(0.1)", "keras.optimizers.Adam(0.01)")

    keras.utils.set_random_seed(0)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        nbdist.train(cell(tmp_path / "ours.keras"), namespace=ns, mode="local",
                     checkpoint_dir=str(tmp_path / "ckpt"))  # its last: the hub's final state
        exec(cell(tmp_path / "fit.keras"), {})  # noqa: S102 - plain Keras, the same cell
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = keras.models.load_model(tmp_path / "ours.keras")
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    keras_own = keras.models.load_model(tmp_path / "fit.keras")
    assert int(ours.optimizer.iterations) == int(keras_own.optimizer.iterations) == 2 * 29
    # exactly what the hub holds: its slots, flat over the trainable variables in their order
    with open(tmp_path / "ckpt" / "meta.json") as f:
        arrays = tmp_path / "ckpt" / json.load(f)["arrays_file"]
    with np.load(arrays) as hub:
        for slot in ("momentum", "velocity"):
            saved = [v for v in ours.optimizer.variables if v.name.endswith(f"_{slot}")]
            assert len(saved) == 4 and np.abs(saved[0].numpy()).max() > 0  # not unbuilt zeros
            flat = np.concatenate([v.numpy().ravel() for v in saved])
            np.testing.assert_allclose(flat, hub[f"shard0.opt.{slot}"], rtol=1e-6, atol=1e-9)
    again = ours.fit(ns["x_train"], ns["y_train"], epochs=1, batch_size=32, verbose=0)
    assert int(ours.optimizer.iterations) == 3 * 29 and np.isfinite(again.history["loss"][0])
