"""The docs cannot drift from the code: what they name exists, what they quote is the code's.

- Every link in README.md and docs/*.md reaches a file of the repository, and its `#anchor` a
  heading of that file; every path or module a doc, docstring or comment names exists (the
  docs never point outside the repository).
- Every flag a doc gives a magic is one that magic takes (`%%distribute --encrypt` is not);
  every other `--flag` the docs name is a benchmark's, a script's or ipyparallel's.
- The MAC algorithm, the frame layout, the wire's limits and the timeouts and sizes the docs
  quote are compared with the code's own constants (FACTS); flag and switch help, and the
  README's prose, quote no measurement (those live in docs/performance.md, with their command).
(docs/reference.md's tables are generated: tests/unit/test_flags.py checks they are fresh.)
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "benchmarks" / "README.md"]
SOURCES = sorted(p for d in ("nbdist", "scripts", "benchmarks", "tests")
                 for p in (ROOT / d).rglob("*.py"))
TOP = ("nbdist", "tests", "benchmarks", "scripts", "docs", "notebooks")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _flat(path: Path) -> str:
    """The page with its whitespace collapsed (a phrase may wrap across lines)."""
    return " ".join(_text(path).split())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped,
    spaces '-'."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    body = re.sub(r"^```.*?^```", "", _text(path), flags=re.M | re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.*)$", body, flags=re.M)}


# -- what the docs name exists -------------------------------------------------------------------

def _links(path: Path) -> list[str]:
    text = _text(path)
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img src="([^"]+)"', text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_reaches_a_file_and_a_heading_of_the_repository(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # http(s), mailto: not ours to check offline
            continue
        target, _, anchor = link.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.is_relative_to(ROOT) or not file.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


def _resolves(name: str) -> bool:
    """A path of the repository (or of nbdist/, as the docs abbreviate), a test's node id, a
    dotted module of nbdist with an attribute it defines, or a bare *.md of the repository."""
    name = name.rstrip(".,:;)")
    if "::" in name:  # a test's node id
        path, test = name.split("::", 1)
        return (_resolves(path)
                and re.search(rf"def {re.escape(test)}\b", _text(ROOT / path)) is not None)
    if name.startswith("nbdist.") and "/" not in name:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:cut])
            module = (base.with_suffix(".py") if base.with_suffix(".py").exists()
                      else base / "__init__.py")
            if module.exists():
                if cut == len(parts):
                    return True
                attr = parts[cut]
                defines = rf"^\s*(def|class) {attr}\b|^\s*{attr}\b[^=\n]*=|\"{attr}\""
                return re.search(defines, _text(module), flags=re.M) is not None
        return False
    if "/" not in name:  # a bare page name: README.md, security.md
        return any((d / name).exists() for d in (ROOT, ROOT / "docs", ROOT / "benchmarks",
                                                 ROOT / "benchmarks" / "results"))
    return (ROOT / name).exists() or (ROOT / "nbdist" / name).exists()


PATH = r"(?:(?:" + "|".join(TOP) + r")/[\w./-]*\w/?(?:::\w+)?|nbdist(?:\.\w+)+|[\w-]+\.md)"
NBDIST_RELATIVE = (r"(?:core|hub|engine|modes|run|cluster|dashboard|checkpoint|fit|algorithms)"
                   r"/[\w./-]*\.(?:py|c)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    names = re.findall(rf"`({PATH}|{NBDIST_RELATIVE})`", _text(page))
    names += re.findall(rf"`({PATH}) ", _text(page))  # a path followed by a name in one span
    missing = sorted({n for n in names if not _resolves(n)})
    assert not missing, (f"{page.relative_to(ROOT)} names what the repository does not hold: "
                         f"{missing}")


def test_every_path_a_docstring_or_comment_names_exists():
    """Docstrings and comments point into the repository, never to files beside it (design
    notes kept elsewhere are not the product's)."""
    missing = []
    for source in SOURCES:
        for name in re.findall(rf"(?<![\w/.]){PATH}", _text(source)):
            if (name.endswith(".md") or "/" in name) and not _resolves(name):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, f"names of files that do not exist: {missing}"


SECTION = r"(README|[\w-]+\.md)(?:'s|,) [\"']([A-Z][^\"'\n]+)[\"']"


def test_every_section_a_page_or_docstring_names_is_a_heading_of_that_page():
    """'docs/guide.md, "Your cell"' and 'the README's "Set up"' name headings that exist."""
    pages = ({p.name: p for p in PAGES if p.parent != ROOT / "benchmarks"}
             | {"README": ROOT / "README.md"})
    missing = []
    for source in [*PAGES, *SOURCES]:
        for page, section in re.findall(SECTION, _text(source)):
            headings = (re.findall(r"^#+ (.*)$", _text(pages[page]), flags=re.M)
                        if page in pages else [])
            if not any(h.replace("`", "").lower().startswith(section.lower()) for h in headings):
                missing.append(f"{source.relative_to(ROOT)}: {page} {section!r}")
    assert not missing, f"sections that are no heading of their page: {missing}"


def test_the_code_tree_names_every_package_and_only_files_that_exist():
    page = _text(ROOT / "docs" / "architecture.md")
    tree = page.split("## The code", 1)[1].split("```", 2)[1]
    packages = {p.parent.relative_to(ROOT / "nbdist").as_posix()
                for p in (ROOT / "nbdist").rglob("__init__.py") if p.parent != ROOT / "nbdist"}
    shown = set(re.findall(r"(\w+)/", tree))
    assert {p.rsplit("/", 1)[-1] for p in packages} <= shown
    files = {p.name for p in (ROOT / "nbdist").rglob("*") if p.suffix in (".py", ".c")}
    assert set(re.findall(r"\b\w+\.(?:py|c)\b", tree)) <= files


# -- the flags the docs give the magics ------------------------------------------------------------

def _other_flags() -> set[str]:
    """Flags of the benchmarks and scripts (their argparse declarations), and ipyparallel's."""
    flags = {"--ip", "--location", "--cluster-id", "--parallel", "--file", "--profile",
             "--IPController.enable_curve"}
    for source in [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        flags |= set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", _text(source)))
    return flags


def test_every_flag_the_docs_give_a_magic_is_one_it_takes():
    import argparse

    from nbdist.flags import distribute_flags, misplaced, nbdist_flags

    distribute = {s for f in distribute_flags() for s in f.spelling}
    distribute |= {"--no-" + f.spelling[-1][2:] for f in distribute_flags() if f.negatable}
    nbdist = {s for f in nbdist_flags() for s in f.spelling}
    known, wrong = distribute | nbdist | _other_flags(), []
    for page in PAGES[:-1]:  # the benchmarks' README is about their own flags
        text = _text(page)
        for line in re.findall(r"%%distribute( [^`\n]*)", text):
            wrong += [f"%%distribute {f}" for f in re.findall(r" (--[\w-]+)", line)
                      if f not in distribute]
        for action, rest in re.findall(r"%nbdist (start|connect|status|stop)( [^`\n]*)?", text):
            args = argparse.Namespace(action=action, n=None, profile=None, cluster_id=None,
                                      encrypt="--encrypt" in (rest or ""), launcher="local")
            args.launcher = "slurm" if "--launcher" in (rest or "") else "local"
            args.cluster_id = "x" if "--cluster-id" in (rest or "") else None
            wrong += [f"%nbdist {action} {f.spelling[-1]}" for f in misplaced(args, nbdist_flags())]
        wrong += [f"{page.name}: {f}" for f in re.findall(r"`[^`\n]*?(--[A-Za-z][\w.-]*)", text)
                  if f not in known]
    assert not wrong, f"flags the docs give that nothing takes: {wrong}"


# -- the numbers the docs quote are the code's ---------------------------------------------------

def _facts() -> list[tuple[str, str]]:
    """(page, phrase) pairs built from the code's constants: each phrase must be on its page."""
    from nbdist.algorithms.blocks import BLOCK, MIN_SPLIT
    from nbdist.algorithms.kernels import STREAM_MIN
    from nbdist.algorithms.optimizers import CACHE_BLOCKED_MIN
    from nbdist.cluster import affinity, netaddr
    from nbdist.cluster.engines import Cluster
    from nbdist.core import coordinator, liveness, simclock
    from nbdist.core.dbs import BatchSizer
    from nbdist.dashboard import widget
    from nbdist.engine.gpu import GPU_EVERY_S
    from nbdist.env import HUB_THREADS_MAX, SWITCHES
    from nbdist.fit.driver import BATCH_HOOK_S
    from nbdist.hub import gate, localline, memory, protocol, server, wire
    from nbdist.modes.common import engine_backend
    from nbdist.modes.common.courier import WayChooser
    from nbdist.modes.pipeline import checks, stage
    from nbdist.modes.sync import rendezvous
    from nbdist.run import monitor

    kib, mib = 1024, 1 << 20
    ending = (monitor.ENDING_REQUEST_S + monitor.GONE_FINISH_S + engine_backend.INTERRUPT_WAIT_S
              + engine_backend.JOIN_MIN_S)
    way = inspect.signature(WayChooser).parameters
    sizer = inspect.signature(BatchSizer).parameters
    mlp = (2 * 4 * 269_322 + 4 * kib + protocol.MAX_HEADER_BYTES + protocol.SIGNATURE_BYTES
           + 256 + mib)
    young = 1 + 1 + gate.YOUNG_MARGIN  # one worker, one shard
    sec, arch, guide = "docs/security.md", "docs/architecture.md", "docs/guide.md"
    return [
        (sec, f"the {protocol.SIGNATURE_BYTES}-byte MAC and the JSON header (at most "
              f"{protocol.MAX_HEADER_BYTES // kib} KiB) share the first frame"),
        (sec, f"under the run's {protocol.KEY_BYTES}-byte random key"),
        (sec, f"a packet over {localline.MAX_PACKET_BYTES // kib} KiB"),
        (sec, f"A hub keeps at most {server.MAX_LOCAL_LINES} such lines open"),
        (sec, f"(`CONNECTION_BYTES` = {gate.CONNECTION_BYTES // kib} KiB)"),
        (sec, f"after `HANDSHAKE_S` = {gate.HANDSHAKE_S:g} s"),
        (sec, f"in their handshake (younger than {gate.HANDSHAKE_S:g} s"),
        (sec, f"plus `YOUNG_MARGIN` = {gate.YOUNG_MARGIN}"),
        (sec, f"a pipeline stage 2 + {gate.YOUNG_MARGIN} = {2 + gate.YOUNG_MARGIN}"),
        (sec, f"`2 x stages + {gate.YOUNG_MARGIN}`"),
        (sec, f"+ {protocol.MAX_HEADER_BYTES // kib} KiB of header + "
              f"{protocol.SIGNATURE_BYTES} bytes of MAC + 256 bytes + 1 MiB"),
        (sec, f"{(checks.HEADER_BYTES - protocol.SIGNATURE_BYTES) // kib} KiB + "
              f"{protocol.SIGNATURE_BYTES} bytes of header + {checks.MARGIN} x the bytes per "
              "sample"),
        (sec, f"x max({stage.VALIDATION_BATCH}, batch size) samples"),
        (sec, f"F = {mlp:,} bytes, L = {young}, at most "
              f"{young * (mlp + gate.CONNECTION_BYTES) / 1e6:.1f} MB"),
        (sec, f"can queue at most {wire.RCVHWM} messages per connection"),
        (sec, f"`MAX_CONNECTIONS` = {rendezvous.MAX_CONNECTIONS} connections open, each cut "
              f"`REQUEST_S` = {rendezvous.REQUEST_S:g} s after its accept"),
        (sec, f"`MAX_HEAD` = {rendezvous.MAX_HEAD // kib} KiB"),
        (sec, f"older than {rendezvous.FRESH_S:g} s makes room"),
        (sec, f"for up to {rendezvous.RETRY_S:g} s, never a DELETE"),
        (sec, f"(up to {rendezvous.MAX_BODY // mib} MiB for a key holder)"),
        (sec, f"`MAX_FRAMES` = {wire.MAX_FRAMES}, ZeroMQ's routing id, the MAC and header, at most "
              f"{wire.MAX_FRAMES - 2} buffers"),
        (arch, f"{server.SETTLE_EVERY} pushes at a time (`server.SETTLE_EVERY`"),
        (arch, f"silent for {liveness.LOST_STEPS} of its own step times"),
        (arch, f"at least {liveness.LOST_FLOOR_S:g} s, {liveness.LOST_FIRST_S:g} s before its "
               f"first push, {liveness.LOST_EVAL_S:g} s while it evaluates"),
        (arch, f"re-balanced every {sizer['rebalance_every'].default} pushes with "
               f"{sizer['hysteresis'].default:.0%} hysteresis"),
        (arch, "each worker's first "
               f"{['', 'one', 'two', 'three'][coordinator.DBS_WARMUP_STEPS]} steps are not "
               "measured"),
        (arch, f"at most {monitor.ENDING_REQUEST_S:g} s for a stop"),
        (arch, f"{monitor.GONE_FINISH_S:g} s for the workers to leave (`GONE_FINISH_S`"),
        (arch, f"{engine_backend.INTERRUPT_WAIT_S:g} s for the ones interrupted then"),
        (arch, f"{engine_backend.JOIN_MIN_S:g} s per hub shard's engine (`JOIN_MIN_S`"),
        (arch, f"`--timeout` + {ending:g} s with one shard"),
        (guide, f"which then ends within {ending:g} s more"),
        (guide, f"within {ending:g} s more ([measured](performance.md#faults))"),
        (arch, f"if the task still runs {engine_backend.RELEASE_GRACE_S:g} s later it "
               "interrupts it"),
        (arch, f"A shard of at least {MIN_SPLIT >> 20}M floats splits"),
        (arch, f"at most {HUB_THREADS_MAX} (1 on a 2-core machine"),
        (arch, f"updates {BLOCK >> 10}K-float blocks"),
        (arch, f"from {CACHE_BLOCKED_MIN >> 20}M floats on the optimizers' formulas"),
        (arch, f"a reply of {STREAM_MIN >> 20}M+ floats with streaming"),
        (arch, f"frames over {memory.LARGE_FRAME_BYTES >> 20} MB"),
        (arch, f"A message of {SWITCHES['NBDIST_MAC_THREADS_MIN_MB'].default:g} MB or more is "
               "MACed"),
        (arch, f"up to {affinity.HUB_SPIN_S * 1e3:g} ms before it sleeps"),
        (arch, f"up to {affinity.WORKER_SPIN_S * 1e3:g} ms for the reply"),
        (guide, f"for up to {affinity.HUB_SPIN_S * 1e3:g} ms before it sleeps"),
        (guide, f"poll up to {affinity.WORKER_SPIN_S * 1e3:g} ms for their replies"),
        (arch, f"alternating blocks of {way['block'].default} over "
               f"{way['block'].default * way['blocks'].default} steps, keeps the faster for "
               f"{way['keep'].default} steps"),
        (guide, f"it refreshes {['', 'once', 'twice'][round(1 / widget.REFRESH_S)]} a second"),
        (guide, f"(above {widget.MANY_WORKERS}, or `--top-k K`)"),
        (guide, f"read every {GPU_EVERY_S:g} s"),
        (guide, f"at most {['', 'once', 'twice'][round(1 / BATCH_HOOK_S)]} a second"),
        (guide, f"(defaults {simclock.DEFAULT_PER_STEP_S * 1e3:g} ms and "
                f"{simclock.DEFAULT_PER_SAMPLE_S * 1e6:g} µs"),
        (guide, f"`jitter` ({simclock.SimOptions().jitter:g}: none"),
        (guide, f"with a {netaddr.REACH_TIMEOUT_S:g} s limit"),
        (guide, "within "
                f"{inspect.signature(Cluster.engine_networks).parameters['timeout'].default:g} "
                "s are named the same way"),
    ]


def test_the_numbers_the_docs_quote_are_the_codes_constants():
    """A constant changed and its page did not (or the page's wording moved): say it again."""
    pages = {}
    stale = [f"{page}: {phrase!r}" for page, phrase in _facts()
             if phrase not in pages.setdefault(page, _flat(ROOT / page))]
    assert not stale, "these pages no longer quote the code's constants: " + "; ".join(stale)


def test_the_mac_and_the_frame_layout_are_what_the_docs_say():
    """The wire's MAC is keyed BLAKE3 over the header's length, the header and every buffer, and
    a message is [MAC + header, *buffers]; every page that names the MAC says so, and HMAC is
    named only beside BLAKE3 (a cost comparison), never as the wire's MAC."""
    import numpy as np
    from blake3 import blake3

    from nbdist.hub.protocol import SIGNATURE_BYTES, Codec, mac, new_key

    key, buffer = new_key(), np.arange(4, dtype=np.float32)
    frames = Codec(key, "a", "run").encode({"op": "x"}, [buffer], to="b")
    signature, header = bytes(frames[0][:SIGNATURE_BYTES]), bytes(frames[0][SIGNATURE_BYTES:])
    expected = blake3(len(header).to_bytes(8, "little") + header + buffer.tobytes(),
                      key=key).digest()
    assert len(frames) == 2 and signature == expected == mac(key, header, [buffer])
    for page in ("docs/security.md", "docs/architecture.md"):
        assert ("`[MAC + header, *buffers]`" in _text(ROOT / page)
                and "keyed BLAKE3" in _text(ROOT / page))
    for page in PAGES:
        prose = re.sub(r"^```.*?^```", "", _text(page), flags=re.M | re.S)
        for paragraph in prose.split("\n\n"):
            assert "HMAC" not in paragraph or "BLAKE3" in paragraph, (page.name, paragraph[:200])


MEASUREMENT = re.compile(r"\d\s?(?:ms|µs|MB/s|samples/s)\b|\d(?:\.\d+)?x\b"
                         r"|% of (?:one|a) core|of fit\b")


def test_measurements_live_in_performance_md_not_in_flags_or_the_readme():
    from nbdist.env import SWITCHES
    from nbdist.flags import distribute_flags, nbdist_flags

    helps = ([f.help for f in (*distribute_flags(), *nbdist_flags())]
             + [s.help for s in SWITCHES.values()])
    assert [h for h in helps if MEASUREMENT.search(h)] == []
    readme = re.sub(r"^```.*?^```", "", _text(ROOT / "README.md"), flags=re.M | re.S)
    assert MEASUREMENT.findall(readme) == []
    assert "docs/performance.md" in readme
