"""Which address and interface a process uses to reach another host, from the routing table.

A hub must listen on the address of its engine's interface that the workers reach, the sync
rendezvous on the kernel's, and Gloo on each rank's interface towards the others. Hostnames
are no guide (`gethostbyname(gethostname())` is 127.0.1.1 on a default Debian install), so
everything here goes by routes, the way the kernel picks a source address:

- `parse_proc_route` reads Linux's `/proc/net/route` (main table), `route_to` does the
  longest-prefix match and picks the interface's address on that route. Both are pure.
- `controller_address` finds the controller's reachable address in ipyparallel's connection
  info, also when it listens on all interfaces (`--ip='*' --location=<address>`).
- `hub_address` and `kernel_address` choose one bind address from the hosts' `HostNet`s: loopback
  only when every process is on one host, else the interface towards the other hosts.
- `host_network` (run on an engine or in the kernel) and `check_reachable` are the only I/O.

Only IPv4: ipyparallel's engines, Horovod's Gloo and the lab networks nbdist targets use it.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import shutil
import socket
import struct
import subprocess
from collections import Counter
from dataclasses import dataclass, field

from nbdist.cluster.affinity import allowed_cores
from nbdist.errors import UnreachableHostError

LOOPBACK = "127.0.0.1"
REACH_TIMEOUT_S = 10.0  # a TCP handshake to a live host on any sane network takes milliseconds


@dataclass(frozen=True)
class Route:
    """One route of the main table: `network/prefix` via `iface` (and `gateway`, if any)."""

    network: str
    prefix: int
    iface: str
    gateway: str | None = None
    metric: int = 0


@dataclass(frozen=True)
class HostNet:
    """What one process knows of its host: enough to choose addresses purely, and the cores it
    may use (a Slurm or taskset core set, not the machine's count: see affinity.cores_per_host)."""

    hostname: str
    host_id: str  # hostname + boot id: equal means shared memory works between the two
    address: str  # its address towards the controller: where the other hosts reach it
    routes: tuple[Route, ...] = ()
    addrs: dict = field(default_factory=dict)  # iface -> [(address, prefix), ...]
    cores: tuple[int, ...] = ()  # empty: not known

    def same_host(self, other: HostNet) -> bool:
        return self.host_id == other.host_id


def _hex_ip(text: str) -> str:
    return socket.inet_ntoa(int(text, 16).to_bytes(4, "little"))


def parse_proc_route(text: str) -> tuple[Route, ...]:
    """The routes in `/proc/net/route` (little-endian hex fields), up ones only.

    Example:
        >>> parse_proc_route("Iface\\tDestination\\tGateway\\tFlags\\tRefCnt\\tUse\\tMetric"
        ...                  "\\tMask\\n"
        ...                  "eth0\\t000012C6\\t00000000\\t0001\\t0\\t0\\t0\\t00FFFFFF\\n")
        (Route(network='198.18.0.0', prefix=24, iface='eth0', gateway=None, metric=0),)
    """
    routes = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8 or not int(f[3], 16) & 0x1:  # RTF_UP
            continue
        mask = bin(int(f[7], 16)).count("1")
        gateway = _hex_ip(f[2]) if int(f[3], 16) & 0x2 else None  # RTF_GATEWAY
        routes.append(Route(_hex_ip(f[1]), mask, f[0], gateway, int(f[6])))
    return tuple(routes)


def parse_ip_addr_json(text: str) -> dict[str, list[tuple[str, int]]]:
    """`ip -j -4 addr show` -> {iface: [(address, prefix), ...]}."""
    out: dict[str, list[tuple[str, int]]] = {}
    for link in json.loads(text or "[]"):
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                out.setdefault(link["ifname"], []).append((a["local"], int(a["prefixlen"])))
    return out


def route_to(routes, addrs: dict, dest: str) -> tuple[str, str]:
    """(interface, source address) this host uses to reach `dest`, as the kernel picks them.

    Loopback and the host's own addresses go over `lo`; otherwise the longest matching prefix
    wins (then the lowest metric), and the source is the interface's address in the route's
    subnet (the gateway's, for a routed destination), else its first address.

    Example:
        >>> routes = (Route("0.0.0.0", 0, "eth0", "10.0.0.1"), Route("198.18.0.0", 24, "lab0"))
        >>> addrs = {"eth0": [("10.0.0.5", 24)], "lab0": [("198.18.0.1", 24)]}
        >>> route_to(routes, addrs, "198.18.0.12"), route_to(routes, addrs, "10.9.9.9")
        (('lab0', '198.18.0.1'), ('eth0', '10.0.0.5'))
    """
    target = ipaddress.IPv4Address(dest)
    if target.is_loopback:
        return "lo", dest
    if any(a == dest for pairs in addrs.values() for a, _ in pairs):
        return "lo", dest
    matches = [r for r in routes
               if target in ipaddress.IPv4Network(f"{r.network}/{r.prefix}", strict=False)]
    if not matches:
        raise UnreachableHostError(
            f"No route to {dest} on this host (Received: routes "
            f"{[f'{r.network}/{r.prefix} {r.iface}' for r in routes]}). Expected a route to the "
            "other hosts of the cluster; check the host's network (`ip route`).")
    best = max(matches, key=lambda r: (r.prefix, -r.metric))
    near = ipaddress.IPv4Address(best.gateway) if best.gateway else target
    own = addrs.get(best.iface) or []
    if not own:
        raise UnreachableHostError(
            f"The route to {dest} goes through {best.iface}, which has no IPv4 address. "
            "Give the interface an address, or fix the route (`ip route`).")
    for a, p in own:
        if near in ipaddress.IPv4Network(f"{a}/{p}", strict=False):
            return best.iface, a
    return best.iface, own[0][0]


def controller_address(config: dict) -> str:
    """The controller's address as the engines reach it, from ipyparallel's connection info.

    A controller on all interfaces (`--ip='*'`) has its real address in `location`; ipyparallel
    rewrites the client's URLs to 127.0.0.1 when that address is the kernel's own, which is
    right for the client but wrong for hubs on other hosts.

    Example:
        >>> controller_address({"registration": "tcp://127.0.0.1:5555", "location": "198.18.0.1"})
        '198.18.0.1'
    """
    url = config.get("registration") or config.get("interface") or ""
    host = url.split("://")[-1].rsplit(":", 1)[0] if "://" in url else ""
    location = config.get("location") or ""
    # "0.0.0.0" is read here (ipyparallel's wildcard), never bound
    if host in ("", "*", "0.0.0.0") or ipaddress.IPv4Address(_as_ip(host)).is_loopback:  # noqa: S104
        if location and location not in ("*", "0.0.0.0"):  # noqa: S104
            return _as_ip(location)
        return LOOPBACK
    return _as_ip(host)


def _as_ip(host: str) -> str:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return socket.gethostbyname(host)


def hub_address(hub: HostNet, peers: list[HostNet]) -> str:
    """The one address a hub binds: loopback when every peer shares its host, else its source
    address towards the peers on other hosts (they must all agree; see `UnreachableHostError`).

    Example:
        >>> routes = (Route("198.18.0.0", 24, "eth0"),)
        >>> hub = HostNet("lab3", "lab3:b", "198.18.0.13", routes, {"eth0": [("198.18.0.13", 24)]})
        >>> hub_address(hub, [hub, HostNet("lab1", "lab1:b", "198.18.0.11")])
        '198.18.0.13'
    """
    remote = [p for p in peers if not p.same_host(hub)]
    if not remote:
        return LOOPBACK
    chosen = Counter()
    for p in remote:
        if ipaddress.IPv4Address(p.address).is_loopback:
            raise UnreachableHostError(
                f"Host {p.hostname} reaches the controller over loopback ({p.address}), yet its "
                f"processes must talk to host {hub.hostname}. Start the controller on an address "
                "the other hosts reach (ipcontroller --ip=<address>, or --ip='*' "
                "--location=<address>).")
        chosen[route_to(hub.routes, hub.addrs, p.address)[1]] += 1
    return chosen.most_common(1)[0][0]


def peer_addresses(hub: HostNet, peers: list[HostNet]) -> list[str]:
    """Where a hub's peers on other hosts connect from: every non-loopback address of their
    hosts (a gate reserves their share of its handshake slots, `nbdist.hub.gate`). Peers on the
    hub's own host come over ipc, which only this user reaches, so none of its addresses is
    listed (another user there connects from them).

    Example:
        >>> hub = HostNet("lab3", "lab3:b", "198.18.0.13")
        >>> lab1 = HostNet("lab1", "lab1:b", "198.18.0.11",
        ...                addrs={"lo": [("127.0.0.1", 8)], "eth1": [("10.1.0.11", 16)]})
        >>> peer_addresses(hub, [hub, lab1])
        ['10.1.0.11', '198.18.0.11']
    """
    found = set()
    for p in peers:
        if p.same_host(hub):
            continue
        for address in [p.address, *(a for pairs in p.addrs.values() for a, _ in pairs)]:
            if not ipaddress.ip_address(address).is_loopback:
                found.add(address)
    return sorted(found)


def kernel_address(kernel: HostNet, peers: list[HostNet]) -> str:
    """Where the kernel's own servers (sync rendezvous, sync metrics hub) listen: as a hub."""
    return hub_address(kernel, peers)


LAUNCHERS = {  # ipyparallel engine launcher -> what to check when it fails
    "local": "Check that this Python can run `python -m ipyparallel.engine`, or start fewer "
             "engines.",
    "slurm": "Check that `sbatch` works here (`sinfo`, SLURM_CONF) and that the job was not left "
             "pending (`squeue`); the engines' output is in the profile's log folder.",
    "mpi": "Check that `mpiexec -n 2 hostname` works here (as root: OMPI_ALLOW_RUN_AS_ROOT=1 and "
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1) and that mpi4py imports "
           "(`python -c 'from mpi4py import MPI'`).",
}


def launcher_controller_ip(launcher: str, net: HostNet | None = None) -> str:
    """Where the controller listens: loopback for local engines; for Slurm or MPI engines, which
    may run on other hosts, this host's address on its default route (or its first address)."""
    if launcher == "local":
        return LOOPBACK
    net = net or host_network(LOOPBACK)
    return primary_address(net)


def primary_address(net: HostNet) -> str:
    """The address of the default route's interface, else the first non-loopback one.

    Example:
        >>> primary_address(HostNet("h", "h:b", "127.0.0.1",
        ...                         (Route("0.0.0.0", 0, "eth0", "10.0.0.1"),),
        ...                         {"lo": [("127.0.0.1", 8)], "eth0": [("10.0.0.5", 24)]}))
        '10.0.0.5'
    """
    defaults = [r for r in net.routes if r.prefix == 0]
    if defaults:  # any address only the default route matches (TEST-NET-1; a lookup, no traffic)
        return route_to(defaults, net.addrs, "192.0.2.1")[1]
    others = [a for name, pairs in sorted(net.addrs.items()) if name != "lo" for a, _ in pairs
              if not ipaddress.IPv4Address(a).is_loopback]
    return others[0] if others else LOOPBACK


def interface_for(dest: str, net: HostNet | None = None) -> str:
    """The interface a server on this host binds to be reached from where `dest` is (e.g.
    HOROVOD_GLOO_IFACE): the route's towards `dest`, except that an address of this host itself
    (the kernel beside a rank whose peers are elsewhere) means the interface that holds it, not
    loopback, which the other hosts cannot reach.

    Example:
        >>> net = HostNet("head", "head:b", "198.18.0.1", (Route("198.18.0.0", 24, "eth0"),),
        ...               {"lo": [("127.0.0.1", 8)], "eth0": [("198.18.0.1", 24)]})
        >>> (interface_for("198.18.0.1", net), interface_for("198.18.0.12", net),
        ...  interface_for("127.0.0.1", net))
        ('eth0', 'eth0', 'lo')
    """
    net = net or host_network(LOOPBACK)
    for iface, pairs in net.addrs.items():
        if iface != "lo" and any(a == dest for a, _ in pairs):
            return iface
    return route_to(net.routes, net.addrs, dest)[0]


# -- I/O ---------------------------------------------------------------------------------------

def _addresses() -> dict[str, list[tuple[str, int]]]:
    ip = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if shutil.which(p)), None)
    if ip:
        out = subprocess.run([ip, "-j", "-4", "addr", "show"],  # noqa: S603 - fixed arguments
                             capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            return parse_ip_addr_json(out.stdout)
    # no iproute2: each interface's primary address through ioctl
    result: dict[str, list[tuple[str, int]]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                # SIOCGIFADDR, then SIOCGIFNETMASK
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])
            except OSError:
                continue
            result[name] = [(addr, ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen)]
    return result


def host_id() -> str:
    """Identifies this machine (hostname + boot id): two processes with the same id share memory
    (the hub's and the pipeline's same-host paths) and a host (`HostNet.same_host`)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def host_network(controller: str) -> HostNet:
    """This process's host: name, identity, routes, addresses and address towards `controller`,
    and the cores this process may use."""
    try:
        with open("/proc/net/route") as f:
            routes = parse_proc_route(f.read())
    except OSError:
        routes = ()
    addrs = _addresses()
    if routes and not ipaddress.IPv4Address(controller).is_loopback:
        address = route_to(routes, addrs, controller)[1]
    elif ipaddress.IPv4Address(controller).is_loopback:
        address = LOOPBACK
    else:  # no /proc (not Linux): ask the kernel with a UDP socket, which sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((controller, 9))
            address = probe.getsockname()[0]
    return HostNet(socket.gethostname(), host_id(), address, routes, addrs, allowed_cores())


def check_reachable(address: str, port: int, what: str, host: str,
                    timeout: float = REACH_TIMEOUT_S) -> None:
    """Raise UnreachableHostError naming `host` and `address:port` unless a TCP connection to it
    is answered (accepted or refused) within `timeout`; a silent network fails fast here instead
    of as a 120 s reply timeout later."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return
    except ConnectionRefusedError:
        return  # the host answered: it is reachable (the caller's own connect reports the port)
    except OSError as exc:
        reason = ("no answer" if isinstance(exc, TimeoutError)
                  else (errno.errorcode.get(exc.errno or 0) or str(exc)))
        raise UnreachableHostError(
            f"Could not reach {what} on host {host} at {address}:{port} within {timeout:.0f}s "
            f"(Received: {reason}). Expected the hosts of the cluster to reach each other on that "
            "address: check that the host is up, that its link and routes work (`ping`, "
            "`ip route`), and that no firewall drops the port range (see docs/guide.md, "
            "'Running on a real cluster').",
            host=host, address=f"{address}:{port}") from None
