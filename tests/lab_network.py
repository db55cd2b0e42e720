"""An emulated lab network on one machine: "hosts" made of Linux network namespaces.

    head (this process's namespace: notebook kernel + ipyparallel controller) ─┐
    lab1 (netns, hostname lab1, 198.18.N.11) ──────────────────────────────────┼─ bridge
    lab2 (netns, hostname lab2, 198.18.N.12) ──────────────────────────────────┘  (its own netns)

- Each host has its own hostname (a UTS namespace per process started there, `unshare --uts`)
  that resolves to its lab address on every lab host (`/etc/netns/<ns>/hosts`, the lab's name
  service), and one address on a bridge that lives in a namespace of its own. Addresses come from
  the benchmarking range 198.18.0.0/15, one /24 per lab, and the hosts have no other route: test
  traffic only goes between the lab's hosts and to loopback.
- Each host's link is shaped in both directions: `tc netem rate R delay D` when the kernel has
  netem, otherwise `tc tbf rate R` (the rate without the delay; `LabNetwork.shaping` says which).
- `names` sets the lab's name service: "lab" (above); "none", where no name but localhost
  resolves on any host; "head-loopback", where the lab hosts also resolve the head's name to
  its lab address but the head resolves its own name to 127.0.0.1 (as a default Debian
  /etc/hosts does). With the last two, processes spawned on the head see that hosts file
  through a mount namespace of their own (`unshare --mount`, a bind mount on /etc/hosts), so
  the machine's real /etc/hosts is never touched.
- `spawn()` starts a process on a host in its own session; `close()` kills every such process
  group (an ipyparallel controller and engines leave children otherwise), then deletes every
  namespace and link. `LabCluster` adds a hand-started controller and `ipengine`s, the way a lab
  starts them.

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2; `unavailable()` says what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

SUBNET_PREFIX = "198.18"
NAMES = ("lab", "none", "head-loopback")  # what each host's /etc/hosts resolves (see the docstring)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why a lab network cannot be built here (None when it can)."""
    if os.geteuid() != 0:
        return (f"needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces; "
                f"running as uid {os.geteuid()}")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (Debian packages iproute2 and util-linux)"
    probe = f"nbdprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (CAP_SYS_ADMIN): {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (delay emulation); tbf is the fallback."""
    name = f"nbdq{os.getpid() % 100000}"
    if _ip("link", "add", name, "type", "veth", "peer", "name", name + "p", check=False).returncode:
        return False
    try:
        return subprocess.run(["tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms"],
                              capture_output=True, timeout=10).returncode == 0
    finally:
        _ip("link", "del", name, check=False)


class LabNetwork:
    """`hosts` emulated hosts plus the head, on one bridge; a context manager.

    Example:
        >>> with LabNetwork(2) as lab:                                   # doctest: +SKIP
        ...     lab.run("lab1", ["ping", "-c1", lab.head_address])
    """

    def __init__(self, hosts: int = 2, rate: str = "1gbit", delay_ms: float = 0.2,
                 names: str = "lab"):
        if names not in NAMES:
            raise ValueError(f"names must be one of {NAMES} (Received: {names!r})")
        self.names = names
        self.tag = uuid.uuid4().hex[:5]
        self.subnet = 1 + int(self.tag, 16) % 250  # one /24 of 198.18.0.0/15 per lab
        self.hostnames = [f"lab{i}" for i in range(1, hosts + 1)]
        self.rate, self.delay_ms = rate, delay_ms
        self.switch = f"nbd{self.tag}sw"
        self.head_link = f"nbd{self.tag}h"
        self.head_address = self._addr(1)
        self.shaping = ""
        self._procs: list[subprocess.Popen] = []
        self._built: list[str] = []
        self._head_etc: Path | None = None  # the head's hosts file, where `names` is not "lab"

    def _addr(self, last: int) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{last}"

    def netns(self, host: str) -> str:
        return f"nbd{self.tag}{host}"

    def address(self, host: str) -> str:
        return (self.head_address if host == "head"
                else self._addr(10 + self.hostnames.index(host) + 1))

    # -- building and tearing down -------------------------------------------------------------

    def __enter__(self) -> LabNetwork:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> None:
        netem = netem_available()
        self.shaping = (f"netem rate {self.rate} delay {self.delay_ms}ms" if netem
                        else f"tbf rate {self.rate} (no netem in this kernel: no delay)")
        _ip("netns", "add", self.switch)
        self._built.append(self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        # the head: this process's own namespace, one veth into the switch
        _ip("link", "add", self.head_link, "type", "veth", "peer", "name", "p0", "netns",
            self.switch)
        self._built.append(self.head_link)
        _ip("addr", "add", f"{self.head_address}/24", "dev", self.head_link)
        _ip("link", "set", self.head_link, "up")
        self._port("p0", None, self.head_link, netem)
        lab_hosts, head_hosts = self.hosts_files()
        if head_hosts is not None:
            self._head_etc = Path(tempfile.mkdtemp(prefix=f"nbd{self.tag}head-"))
            (self._head_etc / "hosts").write_text(head_hosts)
            (self._head_etc / "resolv.conf").write_text(
                "# the lab's head: no DNS, only its hosts file\n")
        for i, host in enumerate(self.hostnames, start=1):
            ns = self.netns(host)
            _ip("netns", "add", ns)
            self._built.append(ns)
            # the lab's name service: `ip netns exec` mounts /etc/netns/<ns>/hosts on /etc/hosts
            Path("/etc/netns", ns).mkdir(parents=True, exist_ok=True)
            Path("/etc/netns", ns, "hosts").write_text(lab_hosts)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self._port(f"p{i}", ns, "eth0", netem)

    def hosts_files(self) -> tuple[str, str | None]:
        """(the lab hosts' /etc/hosts, the head's or None to leave the machine's), by `names`."""
        local = "127.0.0.1 localhost\n"
        if self.names == "none":
            return local, local
        lab = "".join(f"{self.address(h)} {h}\n" for h in self.hostnames)
        if self.names == "lab":
            return local + lab, None
        head = socket.gethostname()
        return local + lab + f"{self.head_address} {head}\n", local + f"127.0.0.1 {head}\n" + lab

    def _port(self, port: str, ns: str | None, iface: str, netem: bool) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        self._shape(self.switch, port, netem)  # towards the host
        self._shape(ns, iface, netem)  # from the host

    def _shape(self, ns: str | None, dev: str, netem: bool) -> None:
        prefix = ["ip", "netns", "exec", ns] if ns else []
        if netem:
            qdisc = ["netem", "rate", self.rate, "delay", f"{self.delay_ms}ms", "limit", "100000"]
        else:
            bits = rate_bits(self.rate)
            # 2 ms of traffic, at least one TSO packet
            burst = max(64 * 1024, int(bits / 8 * 0.002))
            qdisc = ["tbf", "rate", self.rate, "burst", str(burst), "latency", "50ms"]
        subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", *qdisc],
                       check=True, capture_output=True, timeout=30)

    def close(self) -> None:
        """Kill every process group started here, then delete namespaces and links."""
        for p in self._procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # children that outlived their leader, too
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        self._procs.clear()
        for name in reversed(self._built):
            if name == self.head_link:
                _ip("link", "del", name, check=False)
            else:
                _ip("netns", "del", name, check=False)
                shutil.rmtree(Path("/etc/netns", name), ignore_errors=True)
        self._built.clear()
        if self._head_etc is not None:
            shutil.rmtree(self._head_etc, ignore_errors=True)
            self._head_etc = None

    # -- using it ------------------------------------------------------------------------------

    def _wrap(self, host: str, argv: list[str]) -> list[str]:
        if host == "head" and self._head_etc is None:
            return list(argv)
        if host == "head":  # the head's own name service, in a mount namespace of this process's
            mounts = " && ".join(f"mount --bind {self._head_etc / f} /etc/{f}"
                                 for f in ("hosts", "resolv.conf"))
            return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                    f'{mounts} && exec "$@"', "head", *argv]
        return ["ip", "netns", "exec", self.netns(host), "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]

    def run(self, host: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a short command on a host and wait for it."""
        return subprocess.run(self._wrap(host, argv), capture_output=True, text=True,
                              timeout=timeout)

    def spawn(self, host: str, argv: list[str], log: Path,
              env: dict | None = None) -> subprocess.Popen:
        """Start a long-running process on a host, in its own session (killed by `close()`)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(self._wrap(host, argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self._procs.append(proc)
        return proc

    def set_link(self, host: str, up: bool) -> None:
        """Cut or restore a host's cable (its port on the bridge, and its own interface)."""
        state = "up" if up else "down"
        port = "p0" if host == "head" else f"p{self.hostnames.index(host) + 1}"
        _ip("-n", self.netns(host), "link", "set", "eth0", state)
        _ip("-n", self.switch, "link", "set", port, state)
        if up:  # a link set down loses its qdisc shaping on some kernels: put it back
            netem = self.shaping.startswith("netem")
            self._shape(self.switch, port, netem)
            self._shape(self.netns(host), "eth0", netem)
            _ip("-n", self.netns(host), "addr", "replace", f"{self.address(host)}/24", "dev",
                "eth0")

    def leftovers(self) -> list[str]:
        """Namespaces or links of this lab still present (empty after `close()`)."""
        names = _ip("netns", "list", check=False).stdout.split()
        links = _ip("-o", "link", "show", check=False).stdout
        etc = ([f"/etc/netns/{n}" for n in os.listdir("/etc/netns")]
               if os.path.isdir("/etc/netns") else [])
        return ([n for n in names if n.startswith(f"nbd{self.tag}")]
                + [e for e in etc if f"nbd{self.tag}" in e]
                + ([self.head_link]
                   if f" {self.head_link}@" in links or f" {self.head_link}:" in links else []))


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, factor in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * factor
    return float(rate)


class LabCluster:
    """A controller on the head and `ipengine`s on lab hosts, started by hand as a lab would.

    `engines` lists the host of each engine, in the order they register (engine ids 0, 1, ...).
    `controller_ip` is passed to `ipcontroller --ip` ('*' with `--location` = the head's address
    is the common lab set-up). The kernel (this process) connects with `client()` or with
    `%nbdist connect --profile lab --cluster-id lab` after setting IPYTHONDIR to `ipython_dir`.
    """

    def __init__(self, lab: LabNetwork, workdir: Path, engines: list[str],
                 controller_ip: str | None = None, python: str = sys.executable):
        self.lab, self.workdir, self.hosts, self.python = lab, Path(workdir), list(engines), python
        self.ipython_dir = self.workdir / "ipython"
        self.controller_ip = controller_ip or lab.head_address
        self.env = {**os.environ, "IPYTHONDIR": str(self.ipython_dir), "TF_CPP_MIN_LOG_LEVEL": "2",
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())}

    @property
    def security(self) -> Path:
        return self.ipython_dir / "profile_lab" / "security"

    def start(self, timeout: float = 120) -> None:
        args = [self.python, "-m", "ipyparallel.controller", "--profile=lab", "--cluster-id=lab",
                f"--ip={self.controller_ip}", "--log-level=WARN",
                f"--ipython-dir={self.ipython_dir}"]
        if self.controller_ip != self.lab.head_address:
            args.append(f"--location={self.lab.head_address}")
        from IPython.core.profiledir import ProfileDir

        self.ipython_dir.mkdir(parents=True, exist_ok=True)
        ProfileDir.create_profile_dir_by_name(str(self.ipython_dir), "lab")
        controller = self.lab.spawn("head", args, self.workdir / "controller.log", self.env)
        engine_file = self.security / "ipcontroller-lab-engine.json"
        client_file = self.security / "ipcontroller-lab-client.json"
        _wait(lambda: all(f.exists() and json.loads(f.read_text() or "{}")
                          for f in (engine_file, client_file)),
              timeout, f"the controller's connection file {engine_file}",
              self.workdir / "controller.log", controller)
        client = self.client()
        try:
            for n, host in enumerate(self.hosts, start=1):  # one by one: engine ids follow the list
                log = self.workdir / f"engine-{n - 1}-{host}.log"
                engine = self.lab.spawn(host, [self.python, "-m", "ipyparallel.engine",
                                               f"--file={engine_file}", "--log-level=WARN",
                                               "--ipython-dir", str(self.ipython_dir)],
                                        log, self.env)
                _wait(lambda n=n: len(client.ids) >= n, timeout,
                      f"engine {n - 1} on {host} to register", log, engine)
        finally:
            client.close()

    def client(self):
        import ipyparallel as ipp

        return ipp.Client(str(self.security / "ipcontroller-lab-client.json"), timeout=30)


def _wait(condition, timeout: float, what: str, log: Path,
          proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    how = (f"the process exited ({proc.returncode})"
           if proc is not None and proc.poll() is not None else f"waited {timeout:.0f}s")
    raise TimeoutError(f"{how} waiting for {what}; log {log}:\n{tail}")
