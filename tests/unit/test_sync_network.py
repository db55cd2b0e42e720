"""--mode sync across hosts: which interface Gloo binds, when a host's name is refused, which
Horovod builds need that check, and the run.warnings line of --encrypt (pure functions)."""

import pytest

from nbdist.cluster.netaddr import HostNet, Route, interface_for
from nbdist.modes.sync.backend import plaintext_note
from nbdist.modes.sync.network import hostname_refusal, iface_honoured

HEAD = HostNet("head", "head:b", "198.18.7.1",
               # the default route, as the head's routing table shows it
               (Route("198.18.7.0", 24, "nbdh"), Route("0.0.0.0", 0, "eth0", "10.0.0.1")),  # noqa: S104
               {"lo": [("127.0.0.1", 8)], "eth0": [("10.0.0.5", 24)], "nbdh": [("198.18.7.1", 24)]})


def test_a_rank_beside_the_kernel_binds_the_interface_holding_the_kernels_address_not_loopback():
    """The kernel's rendezvous is on the head's lab address; a rank on the head reaches it over
    `lo`, but the other hosts reach that rank only on the interface holding the address."""
    assert interface_for("198.18.7.1", HEAD) == "nbdh"
    assert interface_for("198.18.7.12", HEAD) == "nbdh"  # a rank elsewhere: the route's
    assert interface_for("8.8.8.8", HEAD) == "eth0"
    assert interface_for("127.0.0.1", HEAD) == "lo"  # every rank on this host: loopback is right


@pytest.mark.parametrize(("resolved", "says"), [
    (None, "resolves to nothing (Received: no address)"),
    ("127.0.0.1", "resolves to loopback (Received: 127.0.0.1)"),
    ("127.0.1.1", "resolves to loopback (Received: 127.0.1.1)"),  # Debian's default line
    ("10.0.0.5", "resolves to another address (Received: 10.0.0.5)"),
])
def test_a_name_that_does_not_resolve_to_the_gloo_interface_is_refused_with_the_line_to_add(
        resolved, says):
    message = hostname_refusal("head", resolved, "nbdh", ["198.18.7.1"])
    assert f"Host head's name {says}" in message
    assert "`198.18.7.1 head` in /etc/hosts" in message and "make horovod" in message


def test_a_name_that_resolves_to_the_gloo_interface_passes():
    assert hostname_refusal("head", "198.18.7.1", "nbdh", ["198.18.7.1"]) is None


@pytest.mark.parametrize(("build", "honoured"), [
    ("p1-gloo", True), ("p1-nccl", True), ("p12-gloo", True),
    ("", False),  # Horovod 0.28.1 from PyPI or any build without nbdist's patch
    ("p0-gloo", False), ("unpatched", False), ("p1", False),
])
def test_only_nbdist_patched_builds_skip_the_host_name_check(build, honoured):
    assert iface_honoured(build) is honoured


def test_encrypt_warns_of_plaintext_gloo_only_when_the_ranks_span_hosts():
    assert plaintext_note(False, ["lab1", "lab2"]) is None
    assert plaintext_note(True, ["lab1", "lab1"]) is None  # Gloo over this host only
    note = plaintext_note(True, ["lab2", "lab1", "lab2"])
    assert note.startswith("--encrypt: the ranks on 2 hosts (lab1, lab2)")
    assert "plaintext" in note and "--mode async" in note


@pytest.mark.parametrize(("metadata", "build"), [
    ('{"tensorflow": "2.21.0", "nbdist_build": "p1-gloo", "dummy": "none"}', "p1-gloo"),
    ('{"tensorflow": "2.21.0", "dummy": "none"}', ""),  # built by anyone else
    ("not json", ""), ("[1, 2]", ""), (None, ""),
])
def test_the_build_mark_is_read_from_horovods_metadata_json(tmp_path, metadata, build):
    from nbdist.modes.sync.network import horovod_build

    if metadata is not None:
        (tmp_path / "metadata.json").write_text(metadata)
    assert horovod_build(str(tmp_path)) == build
