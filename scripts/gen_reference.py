"""Write the generated blocks of docs/reference.md from the declarations: what each mode takes
and supports (nbdist.modes, its ModeSpecs), every flag of `%%distribute` and `%nbdist`
(nbdist.flags, TrainConfig's fields, their modes from the specs), the update rules' catalogue
(nbdist.algorithms) and every NBDIST_* switch (nbdist.env). The text around the blocks (the Run
handle, the Python API, ...) is written by hand and kept as it is.

    python scripts/gen_reference.py           # rewrite docs/reference.md
    python scripts/gen_reference.py --check   # exit 1 if it is stale (tests/unit/test_flags.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def _default(declared) -> str:
    """A value in code type; a described default ("the cell's optimizer's") as words."""
    if getattr(declared, "switch", False):
        return "off"
    if declared.shown is None:
        return ""
    return _cell(declared.shown if declared.shown_default is not None else f"`{declared.shown}`")


def _spelling(flag) -> str:
    if flag.negatable:
        return f"`{flag.spelling[-1]}` / `--no-{flag.spelling[-1][2:]}`"
    return " ".join(f"`{name}`" for name in flag.spelling)


def _distribute() -> list[str]:
    from nbdist.flags import MAGIC_FLAGS, config_flags

    lines = [
        "Every training flag is also a keyword of `nbdist.train(cell, ...)` and of "
        "`nbdist.resume(checkpoint, cell, ...)`, and a field of `nbdist.TrainConfig`: "
        "`--batch-size 64` is `batch_size=64`. A flag not given keeps its default (or, with "
        "`--resume`, the checkpoint's value). The modes are those of `--mode`; \"all\" means "
        "every one.",
        "",
        "| flag | keyword | default | choices | modes | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for flag in config_flags():
        lines.append(f"| {_spelling(flag)} | `{flag.name}` | {_default(flag)} | "
                     f"{_cell(', '.join(flag.choice_values or ()))} | "
                     f"{', '.join(flag.modes) if flag.modes else 'all'} | {_cell(flag.help)} |")
    lines += ["", "The magic's own flags (not training options):", "",
              "| flag | default | modes | what it does |", "|---|---|---|---|"]
    for flag in MAGIC_FLAGS:
        lines.append(f"| {_spelling(flag)} | {_default(flag)} | "
                     f"{', '.join(flag.modes) if flag.modes else 'all'} | {_cell(flag.help)} |")
    return lines


def _modes() -> list[str]:
    from nbdist.modes import EVERY_MODE, MODES

    def yes(on: bool) -> str:
        return "yes" if on else "no"

    lines = ["What each `--mode` is and takes, from its spec (`nbdist.modes.MODES`). A flag a "
             "mode does not take is refused, naming the modes it works with; the options every "
             f"mode takes: {', '.join(f'`{_flag(o)}`' for o in sorted(EVERY_MODE))}.", "",
             "| mode | what it does | needs a cluster | checkpoints, `--resume` | "
             "`run.add_workers` | learning rate applied by | mode-specific flags |",
             "|---|---|---|---|---|---|---|"]
    for name, spec in MODES.items():
        flags = ", ".join(f"`{_flag(o)}`" for o in sorted(spec.takes))
        lines.append(f"| `{name}` | {_cell(spec.summary)} | {yes(spec.needs_cluster)} | "
                     f"{yes(spec.checkpoints)} | "
                     f"{yes(spec.supports('add_workers'))} | {spec.lr_owner} | {flags} |")
    return lines


def _flag(option: str) -> str:
    from nbdist.flags import config_flags

    return next(f.spelling[-1] for f in config_flags() if f.name == option)


def _backends() -> list[str]:
    from nbdist.modes import BACKENDS, MODES

    names = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
    lines = [f"| mode | {' | '.join(names[b] for b in BACKENDS)} |",
             "|---|" + "---|" * len(BACKENDS)]
    for name, spec in MODES.items():
        cells = ["works" if b in spec.backends else "refused" for b in BACKENDS]
        lines.append(f"| `{name}` | {' | '.join(cells)} |")
    return lines


def _rules() -> list[str]:
    from nbdist.algorithms import RULES

    def options(rule) -> str:
        few, many = rule.default_options(2), rule.default_options(64)
        shown = [f"`{k}={v:g}`" if many[k] == v else f"`{k}`: by the number of workers"
                 for k, v in few.items()]
        return ", ".join(shown) or "none"

    lines = ["The update rules of `--algorithm`, from their catalogue (`nbdist.algorithms.RULES`): "
             "their options (`--algo-opt NAME=X`, defaults shown) and what each combines with. "
             "Their formulas: [rules.md](rules.md).", "",
             "| rule | options | `--predict-weights` | `--local-steps` | learning rate "
             "applied by |", "|---|---|---|---|---|"]
    for name, rule in RULES.items():
        lines.append(f"| `{name}` | {options(rule)} | {'yes' if rule.predicts_weights else 'no'} | "
                     f"{'yes' if rule.takes_local_steps else 'no'} | "
                     f"{'workers' if rule.workers_step else 'hub'} |")
    return lines


def _nbdist() -> list[str]:
    from nbdist.flags import nbdist_flags

    lines = ["`%nbdist start N`, `%nbdist connect`, `%nbdist status`, `%nbdist stop`; in Python, "
             "`nbdist.Cluster.start(N, ...)` and `nbdist.Cluster.connect(...)`. An argument given "
             "to an action that does not take it is refused.", "",
             "| argument | taken by | default | choices | what it does |", "|---|---|---|---|---|"]
    for flag in nbdist_flags():
        lines.append(f"| {_spelling(flag)} | {', '.join(flag.actions or ('every action',))} | "
                     f"{_default(flag)} | {_cell(', '.join(flag.choice_values or ()))} | "
                     f"{_cell(flag.help)} |")
    return lines


def _switches() -> list[str]:
    from nbdist import env

    lines = ["Read by nbdist's processes (the kernel, the engines and the hubs they start) from "
             "the environment; for measuring or working around a platform, not for runs. A "
             "boolean takes 1/true/yes/on or 0/false/no/off; unset or empty means the default; "
             "any other value is refused with an error that names the switch.", "",
             "| variable | takes | default | what it does |", "|---|---|---|---|"]
    for switch in env.SWITCHES.values():
        takes = "0 or 1" if switch.kind is bool else switch.takes
        lines.append(f"| `{switch.name}` | {_cell(takes)} | {_default(switch)} | "
                     f"{_cell(switch.help)} |")
    return lines


# The generated blocks of docs/reference.md, by name; the text around them is written by hand.
BLOCKS = {"modes": _modes, "distribute": _distribute, "rules": _rules, "nbdist": _nbdist,
          "switches": _switches, "backends": _backends}


def _begin(name: str) -> str:
    return (f"<!-- generated: {name}, by scripts/gen_reference.py from the declarations "
            "(nbdist/modes/__init__.py, nbdist/config.py, nbdist/flags.py, nbdist/algorithms/, "
            "nbdist/env.py); edit those, not this -->")


def _end(name: str) -> str:
    return f"<!-- end of generated: {name} -->"


def render(page: str | None = None) -> str:
    """The page (docs/reference.md as it is, by default) with every generated block rewritten
    from the declarations; the hand-written text around the blocks is kept as it is."""
    page = REFERENCE.read_text() if page is None else page
    for name, block in BLOCKS.items():
        begin, end = _begin(name), _end(name)
        if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
            raise SystemExit(f"{REFERENCE} needs one generated block {name!r}: the line {begin!r}, "
                             f"then the line {end!r} (what is between them is generated)")
        head, rest = page.split(begin + "\n", 1)
        tail = rest.split(end, 1)[1]
        page = head + begin + "\n" + "\n".join(block()) + "\n" + end + tail
    return page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if REFERENCE.read_text() != text:
            print(f"{REFERENCE} is stale: run python scripts/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
