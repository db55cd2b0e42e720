"""Where a pipeline's stages run: each stage's TensorFlow threads, its index among the stages
on its host (its own GPU there), and the addresses its sockets and the kernel's bind. Used at
the start (nbdist.modes.pipeline.start) and when a stage starts again on a free engine
(nbdist.modes.pipeline.runtime)."""

from __future__ import annotations

import os
from collections import Counter

from nbdist.cluster.affinity import cores_per_host
from nbdist.cluster.netaddr import hub_address, kernel_address


def stage_threads(nets: dict | None, engines: list) -> list[int]:
    """TensorFlow threads per stage: the cores of its host (as its engines report them, see
    nbdist.cluster.affinity.cores_per_host) shared by the stages there; stages that are threads
    of this kernel (`nets` None) share its cores."""
    if nets is None:
        return [max(1, (os.cpu_count() or 1) // len(engines))] * len(engines)
    hosts = [nets[e].hostname for e in engines]
    cores, here = cores_per_host((nets[e].hostname, nets[e].cores) for e in engines), Counter(hosts)
    return [max(1, (cores.get(h) or os.cpu_count() or 1) // here[h]) for h in hosts]


def local_ranks(nets: dict | None, engines: list) -> list[int]:
    """Each stage's index among the stages on its host (so each uses its own GPU there); stages
    that are threads of this kernel are all on one host."""
    hosts = [nets[e].hostname for e in engines] if nets is not None else ["kernel"] * len(engines)
    return [hosts[:s].count(h) for s, h in enumerate(hosts)]


def bind_hosts(cluster, nets: dict, engines: list) -> list[str]:
    peers = [*nets.values(), cluster.kernel_network()]
    return [hub_address(nets[e], peers) for e in engines]


def kernel_host(cluster, nets: dict) -> str:
    return kernel_address(cluster.kernel_network(), list(nets.values()))
