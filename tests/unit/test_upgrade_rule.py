"""Which releases a rolling upgrade may mix (tfcluster/bringup/upgrade.py), and the order it goes in."""

from tfcluster.bringup.inventory import Host
from tfcluster.bringup.upgrade import batches, coordinator_order, refusals, release


def test_release_of_a_software_id():
    assert release("0.8.0+1a2b3c") == "0.8.0"
    assert release("0.9.1 from https://pypi.example/simple extras tf") == "0.9.1"


def test_an_upgrade_and_a_patch_downgrade_are_allowed():
    assert refusals("0.9.0", {"h1": "0.8.0", "h2": "0.8.3"}, {"n1": "0.8.0", "n2": "0.7.2"}, {"n1"}) == []
    assert refusals("0.8.0", {"h1": "0.8.2"}, {"n1": "0.8.2"}, {"n1"}) == []


def test_going_back_across_a_minor_release_is_refused_naming_the_host():
    problems = refusals("0.8.5", {"h1": "0.8.0", "h2": "0.9.0"}, {}, set())
    assert len(problems) == 1 and problems[0].startswith("h2 runs 0.9.0") and "from 0.9 to 0.8" in problems[0]
    assert refusals("0.9.0", {"h1": "1.0.0"}, {}, set())


def test_an_agent_left_newer_than_the_coordinators_is_refused_unless_it_is_upgraded_too():
    problems = refusals("0.8.0", {}, {"gpu7": "0.8.1", "gpu8": "0.8.0"}, set())
    assert len(problems) == 1 and problems[0].startswith("node gpu7 runs agent 0.8.1")
    assert refusals("0.8.0", {}, {"gpu7": "0.8.1"}, {"gpu7"}) == []


def test_standbys_go_before_the_leader_and_agents_in_batches():
    a, b, c = (Host(h, 22, coordinator=True) for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3"))
    assert coordinator_order([a, b, c], "10.0.0.1:7070") == [b, c, a]
    assert coordinator_order([a], "") == [a]
    nodes = [Host(f"n{i}", 22, agent=True) for i in range(5)]
    assert [len(g) for g in batches(nodes, 2)] == [2, 2, 1]
