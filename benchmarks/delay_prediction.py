"""What a fixed gradient delay costs each optimizer, and what predicted weights give back, in
one process (no cluster, no hub): the keras.io convnet trained with every gradient computed d
updates late, against the same training with no delay.

What it measures
    The keras.io convnet (conv32-pool-conv64-pool-dropout 0.5-dense10) on 10,800 Fashion-MNIST
    images (fit's 90% of 12,000), 3 epochs at batch 128, tested on 2,000 images. Each step's
    gradient is computed on the weights of d updates before (a "shadow" copy of the model),
    then applied to the current weights by the Keras optimizer:
      plain     the gradient at w_{t-d}: what an async worker does with a delay of d;
      predict   the gradient at w_{t-d} + d (w_{t-d} - w_{t-d-1}): nbdist's --predict-weights,
                the hub's last update extrapolated over the delay.
    Sides: OPTIMIZER:DELAY:plain|predict, OPTIMIZER one of adam (Adam 1e-3), sgdm (SGD 0.05,
    momentum 0.9), sgd (SGD 0.1), rms (RMSprop 1e-3). Each side runs seeds 0..--seeds-1; the
    table gives the mean test accuracy and each seed's.

    python benchmarks/delay_prediction.py                               # Adam: 0, 1, 2 x both
    python benchmarks/delay_prediction.py --seeds 4 --sides sgdm:0:plain sgdm:1:plain \\
        sgdm:1:predict rms:0:plain rms:1:plain rms:1:predict
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common  # noqa: F401 - sys.path and quiet TensorFlow before Keras loads
from _common import table

DEFAULT_SIDES = ["adam:0:plain", "adam:1:plain", "adam:1:predict", "adam:2:plain",
                 "adam:2:predict"]


def data():
    import keras
    import numpy as np

    from nbdist.datasets import load_fashion_mnist

    (x, y), (xs, ys) = load_fashion_mnist()
    x = np.expand_dims(x[:10800].astype("float32") / 255, -1)
    xs = np.expand_dims(xs[:2000].astype("float32") / 255, -1)
    return x, keras.utils.to_categorical(y[:10800], 10), xs, keras.utils.to_categorical(ys[:2000])


def convnet():
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input(shape=(28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2), layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dropout(0.5), layers.Dense(10, activation="softmax")])


def train(arrays, optimizer: str, delay: int, predict: bool, seed: int) -> float:
    """Test accuracy after 3 epochs with every gradient `delay` updates stale."""
    import keras
    import numpy as np
    import tensorflow as tf

    x, y, xs, ys = arrays
    keras.utils.set_random_seed(seed)
    model, shadow = convnet(), convnet()
    opt = {"adam": lambda: keras.optimizers.Adam(),
           "sgdm": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
           "sgd": lambda: keras.optimizers.SGD(0.1),
           "rms": lambda: keras.optimizers.RMSprop()}[optimizer]()
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.CategoricalCrossentropy()

    @tf.function
    def gradient(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, shadow(xb, training=True))
        return tape.gradient(loss, shadow.trainable_variables)

    past = [[v.numpy() for v in model.trainable_variables]]  # w_t, oldest first
    rng = np.random.default_rng(seed)
    for _ in range(3):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 128):
            batch = order[start:start + 128]
            read = max(0, len(past) - 1 - delay)
            weights = past[read]
            if predict and read >= 1:
                lag = len(past) - 1 - read
                weights = [w + lag * (w - b)
                           for w, b in zip(past[read], past[read - 1], strict=True)]
            for variable, value in zip(shadow.trainable_variables, weights, strict=True):
                variable.assign(value)
            opt.apply(gradient(x[batch], y[batch]), model.trainable_variables)
            past = [*past, [v.numpy() for v in model.trainable_variables]][-(delay + 2):]
    model.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    return float(model.evaluate(xs, ys, verbose=0)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--sides", nargs="+", default=DEFAULT_SIDES,
                        help="OPTIMIZER:DELAY:plain|predict (default: Adam at delays 0-2)")
    args = parser.parse_args()
    arrays = data()
    rows = []
    for side in args.sides:
        optimizer, delay, kind = side.split(":")
        started = time.perf_counter()
        accs = [train(arrays, optimizer, int(delay), kind == "predict", s)
                for s in range(args.seeds)]
        rows.append([optimizer, delay, kind, f"{statistics.mean(accs):.4f}",
                     ", ".join(f"{a:.4f}" for a in accs), f"{time.perf_counter() - started:.0f}"])
        print(f"  {side} done", flush=True)
    print(table(["optimizer", "delay", "read", "test acc (mean)", "per seed", "s"], rows))


if __name__ == "__main__":
    main()
