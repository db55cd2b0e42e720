"""One place for switches: every NBDIST_* variable is declared in nbdist.env and read by one
rule; nothing else in nbdist reads one from the environment."""

import logging
import re
from pathlib import Path

import pytest

from nbdist import env
from nbdist.errors import ConfigError

NBDIST = Path(__file__).resolve().parents[2] / "nbdist"
# Not a switch: the sync backend hands the rendezvous' host name to its ranks in their spec.
SPEC_FIELDS = {"NBDIST_RENDEZVOUS_HOST", "NBDIST_COLLECTIVE"}  # a sync rank's variables


@pytest.mark.parametrize(("text", "value"), [
    ("1", True), ("true", True), (" Yes ", True), ("ON", True),
    ("0", False), ("false", False), ("No", False), ("off", False)])
def test_a_boolean_reads_the_same_way_everywhere(monkeypatch, text, value):
    for name, switch in env.SWITCHES.items():
        if switch.kind is bool:
            monkeypatch.setenv(name, text)
            assert env.switch(name) is value, name


def test_unset_or_empty_is_the_default(monkeypatch):
    for name, switch in env.SWITCHES.items():
        monkeypatch.delenv(name, raising=False)
        assert env.switch(name) == switch.default
        monkeypatch.setenv(name, "  ")
        assert env.switch(name) == switch.default


@pytest.mark.parametrize(("name", "text", "takes"), [
    ("NBDIST_KERNELS", "nope", r"0 or 1 \(or false/true, no/yes, off/on\)"),
    ("NBDIST_COURIER", "2", r"0 or 1 \(or false/true, no/yes, off/on\)"),
    ("NBDIST_HUB_THREADS", "0", r"a whole number >= 1"),
    ("NBDIST_HUB_THREADS", "two", r"a whole number >= 1"),
    ("NBDIST_MAC_THREADS_MIN_MB", "-1", r"a number >= 0"),
    ("NBDIST_DASHBOARD", "widgets", r"auto or text"),
])
def test_a_malformed_value_is_refused_naming_the_switch(monkeypatch, name, text, takes):
    monkeypatch.setenv(name, text)
    message = rf"The environment variable {name} takes {takes} \(Received: {name}='{text}'\)"
    with pytest.raises(ConfigError, match=message + r".*unset it for the default"):
        env.switch(name)
    with pytest.raises(ConfigError, match=message):
        env.check_all()


def test_typed_values(monkeypatch):
    monkeypatch.setenv("NBDIST_HUB_THREADS", "3")
    monkeypatch.setenv("NBDIST_MAC_THREADS_MIN_MB", "0.5")
    monkeypatch.setenv("NBDIST_DASHBOARD", "TEXT")
    monkeypatch.setenv("NBDIST_DATA", "~/data")
    assert (env.switch("NBDIST_HUB_THREADS"), env.switch("NBDIST_MAC_THREADS_MIN_MB")) == (3, 0.5)
    assert (env.switch("NBDIST_DASHBOARD"), env.switch("NBDIST_DATA")) == ("text", "~/data")


def test_an_unknown_nbdist_variable_is_warned_about(monkeypatch, caplog):
    monkeypatch.setenv("NBDIST_COURRIER", "0")
    with caplog.at_level(logging.WARNING, logger="nbdist.env"):
        env.check_all()
    assert "NBDIST_COURRIER" in caplog.text and "no such switch" in caplog.text


def test_every_switch_nbdist_names_is_declared_and_only_env_reads_the_environment():
    named, readers = set(), []
    for path in NBDIST.rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"\bNBDIST_[A-Z_]*[A-Z]\b", text))
        if path.name != "env.py" and re.search(r"environ(\.get)?[\[(]\s*[\"']NBDIST_", text):
            readers.append(path.name)
    assert not readers, f"read NBDIST_* without nbdist.env: {readers}"
    assert named - SPEC_FIELDS == set(env.SWITCHES)


def test_the_readers_follow_their_switch(monkeypatch):
    from nbdist.hub import launch, localline, memory, threads
    from nbdist.modes.common import courier

    monkeypatch.setenv("NBDIST_HUB_PROCESS", "false")  # "false" used to mean on for some readers
    monkeypatch.setenv("NBDIST_LOCAL_LINE", "no")
    monkeypatch.setenv("NBDIST_COURIER", "off")
    monkeypatch.setenv("NBDIST_MALLOPT", "false")
    monkeypatch.setenv("NBDIST_HUB_THREADS", "3")
    assert not launch.hub_in_process() and not localline.enabled() and not courier.wanted("tcp")
    assert not memory.reuse_large_buffers(64 << 20) and threads.update_threads() == 3
