"""Checkpoints of an async run: the hubs' state saved atomically, loaded back or refused.

A checkpoint holds every shard's parameters, version and update-rule state (DC-ASGD-a's
running mean of g⊙g, DDC-ASGD's momentum, softsync's buffered pushes), the hub optimizer's
slots and step count (Adam's moments, a schedule's position), the float non-trainable state,
the data position (which chunks of which epoch are trained on; chunks in flight count as not
done), the live learning rate and rule options, the run's configuration and its cell. What a
worker rebuilds on its next pull (DC backups, SSP clocks, DBS speed measurements) is not saved.

Format, with no pickle anywhere: a directory holding `meta.json` and one
`arrays-<run>-<n>.npz` (loaded with allow_pickle=False). `meta.json` names the array file
with its size and SHA-256 and lists every array's shape and dtype. A save writes the array
file under a new name, writes the new meta beside it (a temporary file, fsync), only then
copies `meta.json` to `meta.1.json` (the previous checkpoint: KEEP=2 are kept) and renames the
new meta over `meta.json` (`os.replace`, which needs no room), and removes array files no kept
meta names: a crash, or a full disk, at any moment leaves every complete checkpoint.
(So one folder takes one run at a time: `nbdist.checkpoint.folder`.)
Weights that are not finite are never saved over a good checkpoint. Loading hashes and parses
the same bytes and checks everything before anything is used, so a corrupt or mismatched
checkpoint is refused whole, never half-loaded.

The kernel writes the files (`Run.checkpoint`): it asks every shard for its state over the
control line (op `state`, answered between two messages, so each shard's part is consistent;
what a shard sends and how it takes it back is `nbdist.hub.export`),
so the checkpoint lands where the notebook runs even when the engines are on other machines,
and outlives the hub's engine. Shard 0's parameters and data position are taken together;
further shards answer a moment later, so a chunk may be trained on twice after a resume
(never skipped).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
import zipfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nbdist.algorithms import rule_class
from nbdist.algorithms.optimizers import HubOptimizer
from nbdist.checkpoint.sync_state import check_meta
from nbdist.core.schedule import EpochSchedule
from nbdist.errors import CheckpointError, CheckpointNotFoundError, ConfigError

if TYPE_CHECKING:
    from nbdist.wire.messages import ShardState

# the parts of a shard's state beside its parameters, as `ShardCore.export` names them: the
# rule's, the optimizer's and --average-tail's (`nbdist.hub.export.shard_state` prefixes them)
STATE_PARTS = ("rule", "opt", "tail")
# what `TailAverage.state` saves: numbers, and the sum once the tail started
TAIL_FIELDS = frozenset({"tail.samples", "tail.count", "tail.sum"})
# 2: the cell's optimizer on the hub
FORMAT, FORMAT_VERSION, META = "nbdist-checkpoint", 2, "meta.json"
KEEP = 2  # checkpoints kept in a folder: the newest (meta.json) and the one before (meta.1.json)
_FIX = "Resume from another checkpoint, or start the run afresh with nbdist.train / %%distribute."

# -- kernel side: save --------------------------------------------------------------------------


def prepare_dir(directory: str) -> str:
    """Create the checkpoint folder now, so a bad path fails before any engine is used."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise CheckpointError(
            f"Cannot write checkpoints to {directory!r}: {exc.strerror or exc}. Pass a folder "
            "you can write to as --checkpoint-dir (checkpoint_dir=...)."
        ) from None
    return os.path.abspath(directory)


def save(directory: str, shards: list[tuple[ShardState, list[np.ndarray]]], info: dict,
         keep: int = KEEP) -> str:
    """Write one checkpoint of `shards` (their `state` replies) and `info` (config, cell,
    layout, ...) into `directory`, atomically; returns the path of its `meta.json`. The
    `keep - 1` checkpoints before it stay as `meta.1.json`, ... (newest first). Weights or
    rule state that are not finite (a diverged run) are refused with CheckpointError, and the
    last good checkpoint stays."""
    directory = prepare_dir(directory)
    arrays, shard_meta = {}, []
    for state, buffers in sorted(shards, key=lambda s: s[0].shard):
        i = state.shard
        for name, buf in zip(state.names, buffers, strict=True):
            arrays[f"shard{i}.{name}"] = np.asarray(buf, dtype=np.float32)
        shard_meta.append({k: getattr(state, k) for k in ("version", "lr", "rule", "rule_options",
                                                          "optimizer", "numbers")})
        shard_meta[-1]["size"] = int(arrays[f"shard{i}.params"].size)
    bad = [k for k, v in arrays.items() if not np.isfinite(v).all()]
    if bad:
        raise CheckpointError(
            f"Not saving a checkpoint into {directory}: {', '.join(bad)} hold NaN or infinite "
            "values (Received: a diverged run). The last good checkpoint there is kept. Lower the "
            "learning rate (run.set_lr) or resume from that checkpoint.")
    first = next(s for s, _ in shards if s.shard == 0)  # the coordinator's shard
    schedule = first.schedule
    meta_path = os.path.join(directory, META)
    name = f"arrays-{info.get('run_id', 'run')}-{time.time_ns()}.npz"
    digest, nbytes = _write_atomic(os.path.join(directory, name), lambda f: np.savez(f, **arrays))
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "created": time.time(), **info,
        "arrays_file": name, "sha256": digest, "bytes": nbytes,
        "arrays": {k: {"shape": list(v.shape), "dtype": v.dtype.str} for k, v in arrays.items()},
        "shards": shard_meta, "schedule": schedule, "evals_pending": first.evals_pending,
        "epochs_done": schedule["done"] / schedule["num_samples"], "sync": first.sync,
    }
    # The new meta is complete on disk before anything of the older checkpoints moves: a full
    # disk then fails the save and leaves every earlier checkpoint as it was (the rotation's
    # copies need room too), and only renames, which need none, follow the copies.
    text = json.dumps(meta, indent=1).encode()
    staged = os.path.join(directory, f".meta-new-{name}.json")
    try:
        _write_atomic(staged, lambda f: f.write(text))
        _rotate(directory, keep)  # meta.json stays in place until the new one replaces it
        os.replace(staged, meta_path)
        _fsync_dir(directory)
    except BaseException:
        for leftover in (staged, os.path.join(directory, name)):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        raise
    _remove_unreferenced(directory, keep)
    return meta_path


def older(directory: str, n: int) -> str:
    """The path of the n-th checkpoint before the newest (n=0: `meta.json` itself)."""
    return os.path.join(directory, META if n == 0 else f"meta.{n}.json")


def _rotate(directory: str, keep: int) -> None:
    """meta.(k-1) <- ... <- meta.1 <- meta.json, each an atomic copy (meta.json stays)."""
    for n in range(keep - 1, 0, -1):
        if os.path.isfile(older(directory, n - 1)):
            with open(older(directory, n - 1), "rb") as f:
                text = f.read()
            _write_atomic(older(directory, n), lambda f, text=text: f.write(text))


def _remove_unreferenced(directory: str, keep: int) -> None:
    wanted = {_referenced_file(older(directory, n)) for n in range(keep)}
    for file in set(os.listdir(directory)) - wanted:
        if file.startswith("arrays-") and file.endswith(".npz"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, file))


def _write_atomic(path: str, write) -> tuple[str, int]:
    """`write(file)` into a temporary file beside `path`, fsync, rename over `path`; returns
    the SHA-256 and size of what reached the disk."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        digest, nbytes = _sha256(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)  # the rename itself survives a crash
    return digest, nbytes


def _fsync_dir(folder: str) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _sha256(path: str) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _referenced_file(meta_path: str) -> str | None:
    try:
        with open(meta_path) as f:
            return os.path.basename(str(json.load(f)["arrays_file"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# -- kernel side: load --------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A loaded and verified checkpoint: `meta` (from meta.json) and its arrays."""

    path: str
    meta: dict
    arrays: dict[str, np.ndarray]

    @property
    def params(self) -> np.ndarray:
        return np.concatenate([self.arrays[f"shard{i}.params"]
                               for i in range(len(self.meta["shards"]))])

    @property
    def non_trainable(self) -> np.ndarray:
        return self.arrays["shard0.non_trainable"]

    def check_fits(self, layout: dict, num_samples: int, servers: int) -> None:
        """Refuse a checkpoint made for another model, data set or number of shards."""
        where = f"The checkpoint {self.path}"
        saved = self.meta["layout"]
        for kind in ("trainable", "non_trainable"):
            old, new = saved.get(kind, []), layout[kind]
            for j, (a, b) in enumerate(zip(old, new, strict=False)):
                if list(a) != list(b):
                    raise CheckpointError(
                        f"{where} does not fit this model: {kind} variable {j} has shape {list(a)} "
                        f"there and {list(b)} here. Build the same model as the checkpointed run "
                        "(same layers, same order). " + _FIX)
            if len(old) != len(new):
                raise CheckpointError(
                    f"{where} does not fit this model: it has {len(old)} {kind} variables, this "
                    f"model {len(new)}. Build the same model as the checkpointed run. " + _FIX)
        if int(self.meta["num_samples"]) != num_samples:
            raise CheckpointError(
                f"{where} was taken training on {self.meta['num_samples']} samples; this run's "
                f"data has {num_samples}. Its data position only means something for the same "
                "training arrays: load the same data. " + _FIX)
        if len(self.meta["shards"]) != servers:
            raise CheckpointError(
                f"{where} has {len(self.meta['shards'])} parameter shard(s); this run asks for "
                f"{servers}. Resume with servers={len(self.meta['shards'])} (--servers).")

    def check_optimizer(self, spec: dict | None) -> None:
        """Refuse resuming with another optimizer than the one whose slots were saved."""
        saved = self.meta["shards"][0].get("optimizer")
        name = (lambda s: s["class_name"] if s else "none")  # noqa: E731
        if name(saved) != name(spec):
            raise CheckpointError(
                f"The checkpoint {self.path} holds the state of a {name(saved)} optimizer on the "
                f"hub, but this run's hub would apply {name(spec)}. Compile the cell's model with "
                "the same optimizer (and --server-optimizer) as the checkpointed run. " + _FIX)

    def shard_restores(self) -> list[dict]:
        """What each hub shard gets in `HubSpec.restore`."""
        out = []
        for i, shard in enumerate(self.meta["shards"]):
            state = {"version": shard["version"]}
            for prefix in STATE_PARTS:
                part = {k.split(".", 1)[1]: v for k, v in shard["numbers"].items()
                        if k.startswith(prefix + ".")}
                part.update({k[len(f"shard{i}.{prefix}."):]: v for k, v in self.arrays.items()
                             if k.startswith(f"shard{i}.{prefix}.")})
                state[prefix] = part
            if i == 0:
                state.update(schedule=self.meta["schedule"],
                             evals_pending=self.meta["evals_pending"])
            out.append(state)
        return out


def shard_restore(state: ShardState, buffers: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray,
                                                                          dict]:
    """One shard's `state` reply (`HubControl.state`, as a checkpoint saves it) as what a new
    hub shard starts from: its parameters, its non-trainable state (empty but on shard 0) and
    its `HubSpec.restore`, the same fields `Checkpoint.shard_restores` gives. A run's kernel
    uses it to start a lost shard anew from its latest snapshot (`nbdist.run.takeover`).

    Example:
        >>> from nbdist.wire.messages import ShardState
        >>> s = ShardState(shard=1, version=7, names=["params", "opt.m"], numbers={"opt.t": 7})
        >>> p, nt, r = shard_restore(s, [np.ones(2, np.float32), np.zeros(2, np.float32)])
        >>> p.tolist(), nt.size, r["version"], sorted(r["opt"]), r["rule"]
        ([1.0, 1.0], 0, 7, ['m', 't'], {})
    """
    arrays = dict(zip(state.names, buffers, strict=True))
    restore: dict = {"version": int(state.version)}
    for prefix in STATE_PARTS:
        part = {k.split(".", 1)[1]: v for k, v in state.numbers.items()
                if k.startswith(prefix + ".")}
        part.update({k.split(".", 1)[1]: np.asarray(v, dtype=np.float32).copy()
                     for k, v in arrays.items() if k.startswith(prefix + ".")})
        restore[prefix] = part
    if state.shard == 0:
        restore.update(schedule=state.schedule, evals_pending=list(state.evals_pending),
                       steps=state.steps)
    params = np.asarray(arrays["params"], dtype=np.float32).copy()
    non_trainable = np.asarray(arrays.get("non_trainable", np.zeros(0)), dtype=np.float32).copy()
    return params, non_trainable, restore


def load(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a checkpoint (its folder or its meta.json); raise CheckpointError
    (CheckpointNotFoundError) naming what is wrong. Nothing is used before all checks pass."""
    meta_path = os.fspath(path)
    if os.path.isdir(meta_path):
        meta_path = os.path.join(meta_path, META)
    if not os.path.isfile(meta_path):
        raise CheckpointNotFoundError(
            f"No checkpoint at {os.fspath(path)!r} (looked for {meta_path}). Pass the folder given "
            "as --checkpoint-dir (or the path run.checkpoint() returned).")
    try:
        with open(meta_path, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise _corrupt(meta_path, f"meta.json is not readable JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _corrupt(meta_path,
                       "it is not an nbdist checkpoint (no 'format': 'nbdist-checkpoint')")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"The checkpoint {meta_path} has format version "
                              f"{meta.get('format_version')!r}; this nbdist reads version "
                              f"{FORMAT_VERSION}. " + _FIX)
    missing = [k for k in ("arrays_file", "sha256", "bytes", "arrays", "shards", "schedule",
                           "layout", "num_samples", "config", "evals_pending") if k not in meta]
    if missing:
        raise _corrupt(meta_path, f"meta.json lacks {', '.join(missing)}")
    arrays = _load_arrays(meta_path, meta)
    _check_contents(meta_path, meta, arrays)
    return Checkpoint(meta_path, meta, arrays)


def _load_arrays(meta_path: str, meta: dict) -> dict[str, np.ndarray]:
    name = str(meta["arrays_file"])
    if os.path.basename(name) != name or not name.endswith(".npz"):
        raise _corrupt(meta_path, f"its array file name {name!r} is not a plain .npz name")
    file = os.path.join(os.path.dirname(meta_path), name)
    if not os.path.isfile(file):
        raise _corrupt(meta_path, f"its array file {name} is missing")
    with open(file, "rb") as f:  # hashed and parsed from the same bytes: no swap in between
        data = f.read()
    digest, nbytes = hashlib.sha256(data).hexdigest(), len(data)
    if nbytes != meta["bytes"] or digest != meta["sha256"]:
        raise _corrupt(meta_path, f"{name} has {nbytes} bytes and SHA-256 {digest[:12]}..., "
                                  f"meta.json recorded {meta['bytes']} bytes and "
                                  f"{str(meta['sha256'])[:12]}...")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise _corrupt(meta_path, f"{name} is not a readable .npz ({exc})") from None
    return arrays


def _check_contents(meta_path: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Every array as listed, shard sizes adding up, a consistent data position."""
    index = meta["arrays"]
    if set(index) != set(arrays):
        raise _corrupt(meta_path,
                       f"its arrays {sorted(arrays)} differ from those listed {sorted(index)}")
    for key, spec in index.items():
        a = arrays[key]
        if (list(a.shape) != list(spec["shape"]) or a.dtype.str != spec["dtype"]
                or a.dtype != np.float32):
            raise _corrupt(meta_path, f"array {key} is {a.dtype.str}{list(a.shape)}, listed as "
                                      f"{spec['dtype']}{spec['shape']} (float32 expected)")
    shards = meta["shards"]
    if not shards or any(f"shard{i}.params" not in arrays for i in range(len(shards))):
        raise _corrupt(meta_path, "a shard's parameters are missing")
    sizes = [arrays[f"shard{i}.params"].size for i in range(len(shards))]
    layout = meta["layout"]
    expected = {kind: sum(int(np.prod(s)) for s in layout[kind])
                for kind in ("trainable", "non_trainable")}
    if sum(sizes) != expected["trainable"]:
        raise _corrupt(meta_path, f"its shards hold {sum(sizes)} parameters, its model layout "
                                  f"{expected['trainable']}")
    nt = arrays.get("shard0.non_trainable")
    if nt is None or nt.size != expected["non_trainable"]:
        raise _corrupt(meta_path, "its non-trainable state does not match its model layout")
    try:
        EpochSchedule.from_state(meta["schedule"])
    except ValueError as exc:
        raise _corrupt(meta_path, f"its data position is invalid ({exc})") from None
    if int(meta["schedule"]["num_samples"]) != int(meta["num_samples"]):
        raise _corrupt(meta_path, "its data position is for another number of samples")
    _check_rule_state(meta_path, meta, arrays)

    check_meta(meta_path, meta, arrays, _corrupt)


def _check_rule_state(meta_path: str, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Each shard saved exactly the state its rule (and server optimizer) keeps."""
    # sync's hub (what its checkpoints save) takes no --algorithm and keeps asgd's empty state
    ran = meta["config"].get("algorithm") or "asgd"
    for i, shard in enumerate(meta["shards"]):
        if shard.get("rule") != ran:
            raise _corrupt(meta_path, f"shard {i} ran rule {shard.get('rule')!r}, its config "
                                      f"{ran!r}")
        try:
            kept = rule_class(shard["rule"]).state_fields
        except ConfigError:  # a rule of the user's, not defined in this kernel (yet): the run
            continue  # that resumes it needs it defined, and its start says so
        wanted = {f"rule.{f}" for f in kept}
        wanted |= {f"opt.{f}" for f in _optimizer_fields(meta_path, i, shard)}
        saved = set(shard.get("numbers", {})) | {k.split(".", 1)[1] for k in arrays
                                                  if k.startswith(f"shard{i}.")
                                                  and k.count(".") >= 2}
        tail = {k for k in saved if k.startswith("tail.")}  # --average-tail's, where it ran
        sized = all(arrays[k].shape == arrays[f"shard{i}.params"].shape for k in arrays
                    if k.startswith((f"shard{i}.rule.", f"shard{i}.opt.", f"shard{i}.tail.")))
        if saved - tail != wanted or not tail <= TAIL_FIELDS or not sized:
            raise _corrupt(meta_path, f"shard {i}'s saved rule state {sorted(saved)} is not what "
                                      f"{shard['rule']} keeps ({sorted(wanted)}, one float per "
                                      "parameter)")


def _optimizer_fields(meta_path: str, i: int, shard: dict) -> list[str]:
    """The state shard i's optimizer saves (its slots and counters), or refuse its spec."""
    spec = shard.get("optimizer")
    if spec is None:
        return []

    try:
        return list(HubOptimizer(spec, int(shard["size"])).export_state())
    except Exception as exc:  # noqa: BLE001 - any bad spec is a corrupt checkpoint
        raise _corrupt(meta_path,
                       f"shard {i}'s optimizer {spec!r} cannot be rebuilt ({exc})") from None


def _corrupt(meta_path: str, what: str) -> CheckpointError:
    return CheckpointError(f"The checkpoint {meta_path} is corrupt or incomplete: {what}. "
                           "It was not loaded (nothing was changed). " + _FIX)

