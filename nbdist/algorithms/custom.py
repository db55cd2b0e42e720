"""Update rules written in a notebook: a subclass of `nbdist.Rule`, named by `--algorithm`.

A user's rule must pass, before it runs, what every built-in rule passes (`check_rule`):
- **in place**: a push that says it changed the weights (`on_push` returned True) changed the
  array it was given, not a new one;
- **no allocation proportional to the model per push**: its scratch is allocated once, in
  `__init__` or on the first push, as the built-ins' is (measured with `tracemalloc`);
- **deterministic**: two instances given the same pulls and pushes end with the same weights,
  to the bit.
A rule with its own `gradient()` (what the hub asks with the cell's Adam or momentum) passes the
same on that path, leaves `w` to the optimizer, and answers `(gradient, scale)` or None.
A rule that fails one is refused with the property named and what to change.

The class travels to the hub by value, inside the hub's spec (`nbdist.engine.rule_by_value`), and
the hub process registers it here (`register`), so that `make_rule` finds it by name, as it
finds the built-ins (`RULES`).
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np

from nbdist.algorithms.base import Rule
from nbdist.errors import ConfigError

NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
# The property checks' model: large enough that a copy of the weights (400 KB) stands out
# from a rule's per-push bookkeeping, small enough to check in a few milliseconds.
CHECK_SIZE = 100_000
ALLOCATION_LIMIT = 64_000  # bytes a push may allocate: a few small temporaries, no copy
CHECK_WORKERS = 3
CHECK_PUSHES = 12

# this process's rules from notebooks, by name (the kernel's, or a hub's that received one)
CUSTOM: dict[str, type[Rule]] = {}


def validate_class(rule: object, builtin: set[str]) -> type[Rule]:
    """`rule` as a usable custom rule class: a subclass of `nbdist.Rule` with its own
    `on_push` and a `name` that no built-in rule has; ConfigError saying what to fix."""
    if not (isinstance(rule, type) and issubclass(rule, Rule)):
        raise ConfigError(f"--algorithm takes a rule's name or a subclass of nbdist.Rule "
                          f"(Received: {rule!r}). Define `class MyRule(nbdist.Rule)` with a "
                          "`name` and an `on_push`, and pass the class or its name.")
    name = getattr(rule, "name", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"The rule {rule.__name__} needs a `name`: lower-case letters, digits "
                          f"and dashes, starting with a letter (Received: name={name!r}). Set "
                          f"e.g. `name = \"my-rule\"` in the class.")
    if name in builtin:
        raise ConfigError(f"The rule {rule.__name__} is named {name!r}, as nbdist's built-in "
                          f"rule is. Give it another name, e.g. \"my-{name}\".")
    if rule.on_push is Rule.on_push:
        raise ConfigError(f"The rule {name} has no on_push. Define "
                          "`on_push(self, worker, w, g, lr, delay) -> bool`: apply the "
                          "gradient g to w in place, return True if w changed.")
    return rule


def register_named(namespace: dict | None, name: object, builtin: set[str]) -> None:
    """Register the rule called `name` that the notebook's `namespace` defines (a subclass of
    `nbdist.Rule` with that `name`), so that `--algorithm NAME` finds it; nothing when `name`
    is no string or no such class is there (the config then says what it expected). The
    namespace's class wins over one registered before: a cell edited and run again redefines
    it. `builtin`: the built-in rules' names."""
    if not isinstance(name, str) or not namespace or name in builtin:
        return
    for value in list(namespace.values()):
        if (isinstance(value, type) and issubclass(value, Rule) and value is not Rule
                and getattr(value, "name", None) == name):
            register(validate_class(value, builtin))
            return


def register(rule: type[Rule]) -> None:
    """Make `rule` findable by its name in this process (`make_rule`)."""
    CUSTOM[rule.name] = rule


def check_rule(rule: type[Rule], options: dict | None = None) -> None:
    """Run `rule` on a model of CHECK_SIZE floats, CHECK_WORKERS workers and CHECK_PUSHES
    pushes as the hub does (each worker pulls after its push), and refuse it (ConfigError,
    naming the property) unless it is in place, allocates no copy of the model per push and
    is deterministic; a rule with its own `gradient()` is run on that path too (what the hub
    asks with the cell's Adam or momentum)."""
    paths = [(_apply, "on_push")]
    if rule.gradient is not Rule.gradient:  # what the hub asks with any other optimizer
        paths.append((_apply_gradients, "gradient"))
    for apply, path in paths:
        first = apply(rule, options, check_allocation=True)
        second = apply(rule, options, check_allocation=False)
        if not np.array_equal(first, second, equal_nan=True):
            differ = int(np.count_nonzero(first != second))
            raise ConfigError(
                f"The rule {rule.name} is not deterministic: two instances given the same pulls "
                f"and pushes ended with {differ} of {first.size} weights different (its "
                f"{path}). The hub's rules must give the same weights for the same pushes (a "
                "checkpoint resumes them, tests compare them): seed any randomness from the "
                "worker and the push count, not from the clock or a global generator.")


def _pushes(rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """The checks' starting weights and pushes (worker, gradient), the same for every run."""
    w = rng.standard_normal(CHECK_SIZE).astype(np.float32)
    return w, [(int(rng.integers(CHECK_WORKERS)),
                rng.standard_normal(CHECK_SIZE).astype(np.float32)) for _ in range(CHECK_PUSHES)]


def _made(rule: type[Rule], options: dict | None) -> Rule:
    try:
        return rule(CHECK_SIZE, CHECK_WORKERS, **dict(options or {}))
    except ConfigError:
        raise
    except Exception as exc:  # the user's code: named, with its error
        raise ConfigError(f"The rule {rule.name} failed when made for {CHECK_SIZE} floats and "
                          f"{CHECK_WORKERS} workers: {type(exc).__name__}: {exc}. Its "
                          "__init__(self, size, num_workers, **options) must call "
                          "super().__init__(size, num_workers, **options).") from exc


def _traced(method, args: tuple, check_allocation: bool):
    """`method(*args)`, and the peak bytes it allocated (0 when not checked)."""
    if not check_allocation:
        return method(*args), 0
    tracemalloc.start()
    try:
        result = method(*args)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _allocates(name: str, path: str, peak: int) -> ConfigError:
    return ConfigError(
        f"The rule {name} allocates {peak / 1e3:.0f} KB in a push to a model of "
        f"{CHECK_SIZE * 4 / 1e3:.0f} KB (its {path}): a new array per push (e.g. `w - lr * "
        "g`, `g * g`). The hub applies every push on preallocated buffers: allocate scratch "
        "once in __init__ (np.empty(size, np.float32)) and write into it with out= "
        "(np.multiply(g, g, out=self.scratch)).")


def _apply_gradients(rule: type[Rule], options: dict | None,
                     check_allocation: bool) -> np.ndarray:
    """The gradient path, as the hub runs it with the cell's optimizer: `gradient()` decides
    what to apply (or holds the push), the optimizer (plain SGD here) applies it to w. It
    must leave w as it is, return (an array of the shard's size, a scale) or None, and hand
    the optimizer something in twelve pushes."""
    name = rule.name
    step = np.empty(CHECK_SIZE, np.float32)

    def push(instance: Rule, i: int, worker: int, w: np.ndarray, g: np.ndarray,
             delay: int) -> bool:
        before = w.copy()
        decided, peak = _traced(instance.gradient, (worker, w, g, delay, 1.0),
                                check_allocation and i > 0)  # the first may make scratch
        if peak > ALLOCATION_LIMIT:
            raise _allocates(name, "gradient", peak)
        if not np.array_equal(before, w, equal_nan=True):
            raise ConfigError(
                f"The rule {name}'s gradient() changed the weights it was given: the cell's "
                "optimizer applies what gradient() returns, so w would move twice. Leave w "
                "as it is there and return (the gradient to apply, scale).")
        if decided is None:
            return False
        gradient, scale = _decision(name, decided)
        np.multiply(gradient, np.float32(0.01 * scale), out=step)
        w -= step
        return True

    w, applied = _replay(rule, options, push, "in gradient()",
                         "gradient(self, worker, w, g, delay, scale) gets float32 arrays of the "
                         "shard's size and returns (gradient, scale) or None.")
    if not applied:
        raise ConfigError(f"The rule {name}'s gradient() held back all {CHECK_PUSHES} pushes "
                          "(it returned None every time). Return (gradient, scale) once a push "
                          "is to be applied.")
    return w


def _decision(name: str, decided: object) -> tuple[np.ndarray, float]:
    """`gradient()`'s answer as (gradient, scale); ConfigError unless it is one."""
    ok = (isinstance(decided, tuple) and len(decided) == 2
          and isinstance(decided[0], np.ndarray) and decided[0].shape == (CHECK_SIZE,)
          and isinstance(decided[1], (int, float, np.floating))
          and not isinstance(decided[1], bool))
    if not ok:
        raise ConfigError(
            f"The rule {name}'s gradient() returned {type(decided).__name__}"
            + (f" of {len(decided)}" if isinstance(decided, tuple) else "")
            + f"; expected (a float32 array of the shard's {CHECK_SIZE} floats, a scale), e.g. "
            "`return g, scale`, or None to hold the push back.")
    return decided[0], float(decided[1])


def _apply(rule: type[Rule], options: dict | None, check_allocation: bool) -> np.ndarray:
    """The on_push path, as the hub runs it with plain SGD: each push applied in place."""
    name = rule.name

    def push(instance: Rule, i: int, worker: int, w: np.ndarray, g: np.ndarray,
             delay: int) -> bool:
        before = w.copy()
        changed, peak = _traced(instance.on_push, (worker, w, g, 0.01, delay),
                                check_allocation and i > 0)  # the first may make scratch
        if peak > ALLOCATION_LIMIT:
            raise _allocates(name, "on_push", peak)
        if changed and np.array_equal(before, w):
            raise ConfigError(
                f"The rule {name} is not in place: on_push returned True but left the "
                "weights it was given unchanged (it made a new array, e.g. `w = w - lr * "
                "g`). Write into w: `w -= lr * g`, or np.subtract(w, step, out=w).")
        return bool(changed)

    w, changes = _replay(rule, options, push, "on a push",
                         "on_push(self, worker, w, g, lr, delay) gets float32 arrays of the "
                         "shard's size; on_pull(self, worker, w, version) is called after each "
                         "of the worker's pushes.")
    if not changes:
        raise ConfigError(f"The rule {name} changed no weights in {CHECK_PUSHES} pushes "
                          "(on_push returned False every time). Return True from on_push once "
                          "it has applied an update to w.")
    return w


def _replay(rule: type[Rule], options: dict | None, push, where: str,
            usage: str) -> tuple[np.ndarray, int]:
    """The checks' pushes as the hub makes them: every worker pulls, then each push goes
    through `push(instance, i, worker, w, g, delay)` (True: w changed, a new version) and its
    worker pulls again. Returns the final weights and the number of versions; an error of the
    user's code becomes a ConfigError saying `where` it was raised, and `usage`."""
    w, pushes = _pushes(np.random.default_rng(0))
    instance = _made(rule, options)
    version, read = 0, {}
    try:
        for worker in range(CHECK_WORKERS):
            instance.on_pull(worker, w, version)
            read[worker] = version
        for i, (worker, g) in enumerate(pushes):
            if push(instance, i, worker, w, g, version - read[worker]):
                version += 1
            instance.on_pull(worker, w, version)
            read[worker] = version
    except ConfigError:
        raise
    except Exception as exc:  # the user's code: named, with its error
        raise ConfigError(f"The rule {rule.name} raised {type(exc).__name__} {where}: {exc}. "
                          f"{usage}") from exc
    return w, version
