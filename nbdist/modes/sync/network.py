"""Where a `--mode sync` rank talks to the others, and whether it can: checked on every rank's
engine before any rank starts (`preflight`, called by the kernel), then again by the rank
(`rank_network`), which gives Horovod its interface.

Across hosts, Gloo binds HOROVOD_GLOO_IFACE, the interface towards the kernel. Horovod 0.28.1
as released binds the address of the host's *name* instead for its process sets;
scripts/build_horovod.sh patches that and marks its build in Horovod's metadata.json
(`horovod_build`). With any other build, the host's name must resolve to an address of that
interface (`hostname_refusal`), or Gloo aborts the engines of every rank.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
import socket

from nbdist.cluster.netaddr import check_reachable, host_network, interface_for
from nbdist.errors import UnreachableHostError


def rank_network(env: dict) -> dict:
    """Resolve `HOROVOD_GLOO_IFACE=route:ADDRESS` to this host's interface towards the
    rendezvous (Gloo binds that interface's address), after checking the rendezvous answers
    and, across hosts with a Horovod build that binds the host name's address, that name."""
    env = dict(env)
    iface = env.get("HOROVOD_GLOO_IFACE", "")
    if iface.startswith("route:"):
        address = iface.split(":", 1)[1]
        check_reachable(address, int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                        "the Horovod rendezvous (in the notebook kernel)",
                        env.get("NBDIST_RENDEZVOUS_HOST", "?"))
        env["HOROVOD_GLOO_IFACE"] = interface_for(address)
        # torch.distributed's Gloo binds the interface it is given; Horovod's, by its build
        if (int(env.get("HOROVOD_CROSS_SIZE", "1")) > 1 and env.get("NBDIST_COLLECTIVE") != "torch"
                and not iface_honoured(horovod_build())):
            check_hostname_address(env["HOROVOD_GLOO_IFACE"])
    return env


def preflight(env: dict) -> dict | None:
    """On each rank's engine before any rank starts (the kernel calls it): `rank_network`'s
    checks. A refusal comes back as fields (the kernel raises it) rather than from a rank whose
    peers already wait in Gloo's rendezvous, where a missing rank aborts their engines."""
    try:
        rank_network(env)
    except UnreachableHostError as exc:
        return {"message": str(exc), "host": exc.host, "address": exc.address}
    return None


def horovod_build(folder: str | None = None) -> str:
    """nbdist's mark on the Horovod package in `folder` (default: the installed one): "p1-gloo"
    is patch level p1 with Gloo collectives, from the metadata.json scripts/build_horovod.sh
    writes; "" for any other build, or none."""
    if folder is None:
        spec = importlib.util.find_spec("horovod")  # the bare package: no TensorFlow imported
        folder = (next(iter(spec.submodule_search_locations or []), None) if spec is not None
                  else None)
    try:
        with open(os.path.join(folder or "", "metadata.json")) as f:
            return str(json.load(f).get("nbdist_build", ""))
    except (OSError, ValueError, AttributeError):  # no metadata, not JSON, not an object
        return ""


def iface_honoured(build: str) -> bool:
    """Whether a Horovod build marked `build` binds HOROVOD_GLOO_IFACE in every Gloo context
    (nbdist's patch p1 and later); Horovod 0.28.1 as released binds the host name's address for
    its process sets.

    Example:
        >>> iface_honoured("p1-gloo"), iface_honoured("p2-nccl"), iface_honoured("")
        (True, True, False)
    """
    found = re.fullmatch(r"p(\d+)-\w+", build)
    return found is not None and int(found[1]) >= 1


def check_hostname_address(iface: str) -> None:
    """Refuse, naming the fix, where this host's name does not resolve to an address of `iface`
    (`hostname_refusal`); I/O side."""
    name = socket.gethostname()
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        resolved = None
    refusal = hostname_refusal(name, resolved, iface,
                               [a for a, _ in host_network("127.0.0.1").addrs.get(iface, [])])
    if refusal is not None:
        raise UnreachableHostError(refusal, host=name, address=resolved)


def hostname_refusal(name: str, resolved: str | None, iface: str, own: list[str]) -> str | None:
    """Why ranks on other hosts could not reach this one, or None. Horovod 0.28.1 as released
    connects its process-set contexts on the address of the host's *name*, not on
    HOROVOD_GLOO_IFACE (`iface`, whose addresses are `own`): a name that resolves to nothing, to
    loopback or elsewhere makes Gloo abort the engines of every rank.

    Example:
        >>> hostname_refusal("head", "198.18.0.1", "eth0", ["198.18.0.1"]) is None
        True
        >>> hostname_refusal("head", "127.0.0.1", "eth0", ["198.18.0.1"])[:64]
        "Host head's name resolves to loopback (Received: 127.0.0.1), but"
    """
    if resolved in own:
        return None
    where = "nothing" if resolved is None else (
        "loopback" if ipaddress.ip_address(resolved).is_loopback else "another address")
    target = own[0] if own else "that address"
    return (f"Host {name}'s name resolves to {where} (Received: {resolved or 'no address'}), but "
            f"its ranks talk to the other hosts on {iface} ({', '.join(own) or 'no address'}). "
            "This Horovod build binds the address of the host's name for part of its set-up, so "
            "ranks on other hosts could not reach it. Rebuild Horovod with nbdist's patch "
            f"(`make horovod`, scripts/build_horovod.sh), or make {name} resolve to {target} (the "
            f"line `{target} {name}` in /etc/hosts, or DNS), or use --mode async.")
