"""cluster.toml is read strictly: each mistake is refused with the key (and the host) it is about."""

from __future__ import annotations

import pytest

from tfcluster.bringup.inventory import InventoryError, parse


def base(**extra) -> dict:
    data = {"coordinators": [{"host": "10.0.0.1"}], "nodes": [{"host": "10.0.0.11"}, {"host": "10.0.0.12"}]}
    data.update(extra)
    return data


def test_a_small_inventory_reads_with_its_defaults():
    inv = parse(base(software={"extras": []}))
    assert [h.host for h in inv.hosts] == ["10.0.0.1", "10.0.0.11", "10.0.0.12"]
    assert [h.roles for h in inv.hosts] == ["coordinator", "agent", "agent"]
    assert inv.software.prefix == "/opt/tfcluster" and inv.software.requirement("0.8.0") == "tfcluster==0.8.0"
    assert inv.ssh.user == "root" and not inv.ssh.sudo and inv.coordinator_address == "10.0.0.1:7070"
    assert inv.hosts[1].gpus is None and inv.hosts[1].port_range == "20000-20999"


def test_a_coordinator_listed_as_a_node_is_one_host_with_both_roles():
    inv = parse({"coordinators": [{"host": "a"}], "nodes": [{"host": "a", "gpus": 0}]})
    assert [(h.host, h.roles, h.gpus) for h in inv.hosts] == [("a", "coordinator+agent", 0)]


@pytest.mark.parametrize("data, said", [
    (base(extra=1), "cluster.toml: extra: unknown key"),
    (base(ssh={"usr": "root"}), "ssh.usr: unknown key"),
    (base(nodes=[{"host": "n1", "port_range": "30000-2000"}]), "nodes[0].port_range: n1: expected FIRST-LAST"),
    (base(nodes=[{"host": "n1", "port_range": "80-90"}]), "nodes[0].port_range: n1: expected FIRST-LAST"),
    (base(nodes=[{"host": "n1", "gpus": "many"}]), "nodes[0].gpus: n1: expected \"auto\""),
    (base(nodes=[{"host": "n1", "advertise_address": "n1.lan"}]), "nodes[0].advertise_address: n1: expected an IP"),
    (base(nodes=[{"host": "n1"}, {"host": "n1"}]), "nodes[1].host: n1 is listed twice"),
    (base(nodes=[{"port_range": "1-2"}]), "nodes[0].host: missing"),
    (base(coordinators=[{"host": "a"}, {"host": "b"}]), "got 2: the etcd members on two hosts keep no quorum"),
    (base(coordinators=[{"host": "a"}] * 4), "coordinators: expected one coordinator, or three (on etcd), got 4"),
    (base(coordinators=[{"host": "a"}, {"host": "b"}, {"host": "a"}]), "coordinators[2].host: a is listed twice"),
    (base(coordinators=[]), "coordinators: expected a non-empty array"),
    (base(software={"source": "index"}), "software.index_url: source = \"index\" needs"),
    (base(software={"prefix": "/usr"}), "software.prefix: expected an absolute path of a directory of its own"),
    (base(software={"extras": ["tf;rm"]}), "software.extras: expected extras' names"),
    (base(ssh={"port": 70000}), "ssh.port: expected a TCP port"),
    (base(ssh={"options": ["-oProxyCommand=x"]}), "ssh.options: expected NAME=VALUE"),
    (base(nodes=[{"host": "n1", "name": "x"}, {"host": "n2", "name": "x"}]), "n2 and n1 are both named 'x'"),
])
def test_a_mistake_is_refused_naming_its_key(data, said):
    with pytest.raises(InventoryError) as refused:
        parse(data)
    assert said in str(refused.value)


def test_three_coordinators_run_on_etcd_and_agents_are_given_all_three():
    inv = parse({"coordinators": [{"host": "c1"}, {"host": "c2"}, {"host": "c3"}], "nodes": [{"host": "n1"}]})
    assert inv.on_etcd and [h.roles for h in inv.hosts] == ["coordinator"] * 3 + ["agent"]
    assert inv.coordinator_address == "c1:7070,c2:7070,c3:7070"
    assert not parse({"coordinators": [{"host": "c1"}]}).on_etcd


def test_the_shipped_example_reads():
    from pathlib import Path

    from tfcluster.bringup.inventory import load

    inventory = load(Path(__file__).resolve().parents[2] / "examples" / "cluster.toml")
    assert [h.host for h in inventory.hosts] == ["10.0.0.1", "10.0.0.11", "10.0.0.12"]
