"""Choosing addresses and interfaces from routing tables: pure functions, exact answers."""

import pytest

from nbdist.cluster.netaddr import (
    HostNet,
    Route,
    controller_address,
    hub_address,
    parse_ip_addr_json,
    parse_proc_route,
    route_to,
)
from nbdist.errors import UnreachableHostError

PROC_ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
lab0\t000012C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
down0\t000013C6\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""
ADDRS = {"lo": [("127.0.0.1", 8)], "eth0": [("10.0.0.5", 24)], "lab0": [("198.18.0.1", 24)]}


def lab_host(name: str, last: int) -> HostNet:
    addr = f"198.18.0.{last}"
    return HostNet(name, f"{name}:boot", addr, (Route("198.18.0.0", 24, "eth0"),),
                   {"lo": [("127.0.0.1", 8)], "eth0": [(addr, 24)]})


def test_proc_route_is_parsed_little_endian_with_gateways_and_without_down_routes():
    assert parse_proc_route(PROC_ROUTE) == (
        Route("0.0.0.0", 0, "eth0", "10.0.0.1", 100),  # noqa: S104 - a default route, parsed
        Route("10.0.0.0", 24, "eth0", None, 100),
        Route("198.18.0.0", 24, "lab0", None, 0),
    )


def test_ip_json_addresses_keep_every_ipv4_address_of_an_interface():
    text = ('[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},'
            '{"ifname":"eth0","addr_info":[{"family":"inet","local":"198.18.0.11","prefixlen":24},'
            '{"family":"inet6","local":"fe80::1","prefixlen":64},'
            '{"family":"inet","local":"198.18.1.11","prefixlen":24}]}]')
    assert parse_ip_addr_json(text) == {"lo": [("127.0.0.1", 8)],
                                        "eth0": [("198.18.0.11", 24), ("198.18.1.11", 24)]}


@pytest.mark.parametrize("dest, expected", [
    ("198.18.0.12", ("lab0", "198.18.0.1")),  # the lab subnet beats the default route
    ("10.0.0.77", ("eth0", "10.0.0.5")),
    ("8.8.8.8", ("eth0", "10.0.0.5")),  # default route: the address in the gateway's subnet
    ("127.0.1.1", ("lo", "127.0.1.1")),  # Debian's hostname address is loopback
    ("198.18.0.1", ("lo", "198.18.0.1")),  # our own address: same host
])
def test_route_to_picks_longest_prefix_and_the_interface_address_on_it(dest, expected):
    assert route_to(parse_proc_route(PROC_ROUTE), ADDRS, dest) == expected


def test_route_to_a_network_without_a_route_names_the_destination():
    routes = (Route("198.18.0.0", 24, "eth0"),)  # a lab host: no route out
    with pytest.raises(UnreachableHostError, match=r"No route to 192\.0\.2\.9"):
        route_to(routes, {"eth0": [("198.18.0.11", 24)]}, "192.0.2.9")


def test_route_through_an_interface_without_address_says_so():
    with pytest.raises(UnreachableHostError, match="eth1, which has no IPv4 address"):
        route_to((Route("198.18.0.0", 24, "eth1"),), {}, "198.18.0.9")


@pytest.mark.parametrize("config, expected", [
    ({"registration": "tcp://198.18.0.1:4000"}, "198.18.0.1"),
    # --ip='*' --location=198.18.0.1: ipyparallel rewrote the client's URL to localhost
    ({"registration": "tcp://127.0.0.1:4000", "location": "198.18.0.1"}, "198.18.0.1"),
    ({"registration": "tcp://*:4000", "location": "198.18.0.1"}, "198.18.0.1"),
    ({"registration": "tcp://127.0.0.1:4000", "location": None}, "127.0.0.1"),
    ({"registration": "tcp://127.0.0.1:4000"}, "127.0.0.1"),
])
def test_controller_address_follows_location_when_the_controller_listens_everywhere(config,
                                                                                    expected):
    assert controller_address(config) == expected


def test_hub_binds_loopback_only_when_every_peer_shares_its_host():
    hub = lab_host("lab3", 13)
    assert hub_address(hub, [hub, hub]) == "127.0.0.1"


def test_hub_binds_its_interface_towards_workers_on_two_other_hosts():
    hub = lab_host("lab3", 13)
    assert hub_address(hub, [lab_host("lab1", 11), lab_host("lab2", 12), hub]) == "198.18.0.13"


def test_mixed_run_hub_binds_the_remote_facing_address():
    head = HostNet("head", "head:boot", "198.18.0.1", parse_proc_route(PROC_ROUTE), ADDRS)
    local_worker = head
    assert hub_address(head, [local_worker, lab_host("lab1", 11)]) == "198.18.0.1"


def test_hub_refuses_a_peer_that_reaches_the_controller_over_loopback():
    hub = lab_host("lab3", 13)
    stray = HostNet("lab1", "lab1:boot", "127.0.0.1")
    with pytest.raises(UnreachableHostError,
                       match=r"Host lab1 reaches the controller over loopback.*--location"):
        hub_address(hub, [stray])


def test_slurm_and_mpi_controllers_listen_on_the_default_route_address_local_on_loopback():
    from nbdist.cluster.netaddr import launcher_controller_ip, primary_address

    head = HostNet("head", "head:boot", "127.0.0.1", parse_proc_route(PROC_ROUTE), ADDRS)
    assert primary_address(head) == "10.0.0.5"
    assert (launcher_controller_ip("slurm", head) == launcher_controller_ip("mpi", head)
            == "10.0.0.5")
    assert launcher_controller_ip("local", head) == "127.0.0.1"
    no_default = HostNet("lab1", "lab1:b", "198.18.0.11", (Route("198.18.0.0", 24, "eth0"),),
                         {"lo": [("127.0.0.1", 8)], "eth0": [("198.18.0.11", 24)]})
    assert primary_address(no_default) == "198.18.0.11"
