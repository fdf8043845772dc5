"""The policy file: what it accepts, how every mistake is named (file, key, reason), and which class a job gets."""

from __future__ import annotations

import pytest

from tfcluster.daemon.coordinator.core.scheduling.policy import NO_POLICY, ClassRefused, PolicyError, parse

EXAMPLE = """
[classes]
low    = { value = 10, preemptible = true }
normal = { value = 50, preemptible = true }
high   = { value = 100, preemptible = false }

[defaults]
class = "normal"
max_class = "normal"
fair_share_half_life = "7d"

[users.alice]
gpus = 8
running_jobs = 4
max_class = "high"

[users.carol]
class = "low"
gpu_hours = 500
window = "7d"

[groups.vision]
gpus = 16
max_class = "high"

[groups.interns]
class = "low"
max_class = "low"
"""


def test_the_documented_example_parses():
    p = parse(EXAMPLE, "policy.toml", now=123.0)
    assert {c.name: (c.value, c.preemptible) for c in p.classes.values()} == \
        {"low": (10, True), "normal": (50, True), "high": (100, False)}
    assert (p.defaults.default_class, p.defaults.max_class, p.fair_share_half_life) == ("normal", "normal", 7 * 86400)
    assert (p.users["alice"].gpus, p.users["alice"].running_jobs, p.users["alice"].max_class) == (8, 4, "high")
    assert (p.users["carol"].gpu_hours, p.users["carol"].window_seconds) == (500.0, 7 * 86400)
    assert p.groups["vision"].gpus == 16
    assert (p.source, p.loaded_at, p.text) == ("policy.toml", 123.0, EXAMPLE)
    assert [s.key for s in p.subjects("alice", ("vision", "other"))] == ["alice", "group:vision"]


@pytest.mark.parametrize("text, message", [
    ("[users.alice]\ngpus = -1", "policy.toml: users.alice.gpus: expected a whole number >= 0, got -1"),
    ("[users.alice]\ngpus = 2.5", "policy.toml: users.alice.gpus: expected a whole number >= 0, got 2.5"),
    ("[groups.vision]\nrunning_jobs = true",
     "policy.toml: groups.vision.running_jobs: expected a whole number >= 0, got True"),
    ("[users.alice]\ngpu = 2", "policy.toml: users.alice.gpu: unknown key (known: gpus, running_jobs, gpu_hours"),
    ("[users.alice]\ngpu_hours = 10", "policy.toml: users.alice.window: required with gpu_hours"),
    ("[users.alice]\nwindow = \"7d\"", "policy.toml: users.alice.window: goes with gpu_hours"),
    ("[users.alice]\ngpu_hours = -3\nwindow = \"1d\"", "policy.toml: users.alice.gpu_hours: expected a number >= 0"),
    ("[users.alice]\ngpu_hours = 3\nwindow = \"a week\"",
     "policy.toml: users.alice.window: expected a duration such as \"7d\", \"12h\" or \"30m\", got 'a week'"),
    ("[classes]\nhigh = { value = \"100\" }",
     "policy.toml: classes.high.value: expected a whole number between -2147483648 and 2147483647, got '100'"),
    ("[classes]\nhigh = { preemptible = false }", "policy.toml: classes.high.value: required"),
    ("[classes]\nhigh = { value = 1, preemptible = \"no\" }",
     "policy.toml: classes.high.preemptible: expected true or false, got 'no'"),
    ("[classes]\nHigh = 1", "policy.toml: classes.High: a class name is lowercase"),
    ("[classes]\nhigh = \"x\"", "policy.toml: classes.high: expected { value = N, preemptible = true|false }"),
    ("[classes]\nlow = 1\n[defaults]\nclass = \"urgent\"",
     "policy.toml: defaults.class: 'urgent' is not a priority class (classes: low (1))"),
    ("[classes]\nlow = 1\n[users.bob]\nmax_class = \"top\"", "policy.toml: users.bob.max_class: 'top' is not a"),
    ("[classes]\nlow = 1\nhigh = 2\n[users.bob]\nclass = \"high\"\nmax_class = \"low\"",
     "policy.toml: users.bob.class: 'high' is above max_class 'low'"),
    ("[defaults]\nfair_share_half_life = 7", "policy.toml: defaults.fair_share_half_life: expected a duration"),
    ("[defaults]\ngpus = 4", "policy.toml: defaults.gpus: unknown key"),
    ("[quotas]\nx = 1", "policy.toml: quotas: unknown key (known: classes, defaults, users, groups)"),
    ("users = 3", "policy.toml: users: expected a table, got 3"),
    ("[users]\nalice = 3", "policy.toml: users.alice: expected a table, got 3"),
    ("[users.alice\n", "policy.toml: not valid TOML"),
])
def test_every_mistake_names_the_file_the_key_and_the_reason(text, message):
    with pytest.raises(PolicyError) as e:
        parse(text, "policy.toml")
    assert str(e.value).startswith(message), str(e.value)


def test_classes_default_to_the_lowest_and_nobody_rises_by_leaving_it_out():
    p = parse("[classes]\nhigh = 100\nlow = 10\n", "p.toml")
    assert (p.defaults.default_class, p.defaults.max_class) == ("low", "low")
    assert p.resolve("", "anyone", ()).name == "low"
    with pytest.raises(ClassRefused, match="'high' is above anyone's highest class, 'low'"):
        p.resolve("high", "anyone", ())


def test_class_resolution_user_over_groups_over_defaults():
    p = parse(EXAMPLE, "policy.toml")
    assert p.resolve("", "bob", ()).name == "normal"            # defaults
    assert p.resolve("", "dave", ("interns",)).name == "low"    # a group's default
    assert p.resolve("high", "dave", ("vision",)).name == "high"  # a group raises the highest class
    assert p.resolve("high", "alice", ()).name == "high"        # the user's own
    chosen = p.resolve("high", "alice", ())
    assert (chosen.value, chosen.preemptible) == (100, False)
    assert p.resolve("", "carol", ("vision",)).name == "low"    # the user's own default over the groups'
    with pytest.raises(ClassRefused, match="priority: 'high' is above bob's highest class, 'normal'"):
        p.resolve("high", "bob", ())
    with pytest.raises(ClassRefused, match=r"priority: 'urgent' is not a priority class \(classes: high \(100\), "
                                           r"normal \(50\), low \(10\)\)"):
        p.resolve("urgent", "alice", ())
    # Of several groups, the best they give.
    assert p.resolve("high", "erin", ("interns", "vision")).name == "high"


def test_without_a_policy_there_is_one_class_and_asking_for_another_is_refused():
    assert NO_POLICY.resolve("", "alice", ()).name == ""
    assert NO_POLICY.subjects("alice", ("vision",)) == ()
    with pytest.raises(ClassRefused, match="'high' is not a priority class: this cluster has none"):
        NO_POLICY.resolve("high", "alice", ())


def test_a_policy_of_quotas_alone_keeps_one_class():
    p = parse("[users.alice]\ngpus = 2\n", "p.toml")
    assert p.resolve("", "alice", ()).name == "" and p.users["alice"].gpus == 2
