"""The admin's policy file (`tfcluster coordinator --policy policy.toml`): priority classes, who may use which,
and quotas per user and per group. Pure: parsing takes the file's text, resolution takes a job's owner.

A policy with a mistake is refused whole, naming the file, the key and the reason, so the coordinator never
runs on half a policy: at start it exits, on a reload the policy in force stays. Without a file there is one
class and no quota: every job is alike and the queue is first come, first placed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_HALF_LIFE_SECONDS = 7 * 86400.0
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CLASS_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
LIMIT_KEYS = ("gpus", "running_jobs", "gpu_hours", "window", "class", "max_class")


class PolicyError(ValueError):
    """A policy file that cannot be used: "FILE: KEY: reason"."""


class ClassRefused(ValueError):
    """A job asks for a priority class it may not have: why, in one line."""


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool = True


@dataclass(frozen=True)
class Limits:
    """One user's or one group's quotas and classes; None / "": not set here."""
    gpus: int | None = None
    running_jobs: int | None = None
    gpu_hours: float | None = None
    window_seconds: float = 0.0  # the rolling window gpu_hours is counted over
    window: str = ""             # as written ("7d"), for messages
    default_class: str = ""
    max_class: str = ""

    @property
    def has_quota(self) -> bool:
        return self.gpus is not None or self.running_jobs is not None or self.gpu_hours is not None


@dataclass(frozen=True)
class Subject:
    """Whom a quota belongs to: a user, or a group its members share."""
    kind: str  # "user" or "group"
    name: str
    limits: Limits

    @property
    def key(self) -> str:
        """Its key in the usage mappings: the user's name, or "group:NAME"."""
        return self.name if self.kind == "user" else f"group:{self.name}"

    def __str__(self) -> str:
        return f"{self.name}'s" if self.kind == "user" else f"group {self.name}'s"


NO_CLASS = PriorityClass("", 0, True)


MAX_SUBJECTS_KEPT = 10_000


@dataclass(frozen=True)
class Policy:
    classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    defaults: Limits = Limits()
    fair_share_half_life: float = DEFAULT_HALF_LIFE_SECONDS
    users: Mapping[str, Limits] = field(default_factory=dict)
    groups: Mapping[str, Limits] = field(default_factory=dict)
    text: str = ""     # the file as loaded: `tfcluster policy` shows it
    source: str = ""   # where it was loaded from; "": no policy file
    loaded_at: float = 0.0
    # (owner, groups) -> subjects: asked for every waiting and every placed job on each pass, of a few owners
    _subjects: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def fair_share(self) -> bool:
        """Whether owners' usage orders the queue: only under a policy (without one it is first come, first placed)."""
        return bool(self.source)

    def gpu_hour_windows(self) -> dict[str, float]:
        """Subject.key -> the rolling window (seconds) of each GPU-hour quota the policy sets."""
        return {Subject(kind, name, limits).key: limits.window_seconds
                for kind, table in (("user", self.users), ("group", self.groups))
                for name, limits in table.items() if limits.gpu_hours is not None}

    def subjects(self, owner: str, groups: Iterable[str]) -> tuple[Subject, ...]:
        """The user and the groups whose quotas a job of this owner counts against (those the policy names)."""
        if not self.users and not self.groups:  # no quotas at all
            return ()
        groups = tuple(groups)
        found = self._subjects.get((owner, groups))
        if found is None:
            found = ((Subject("user", owner, self.users[owner]),) if owner in self.users else ()) + \
                tuple(Subject("group", g, self.groups[g]) for g in dict.fromkeys(groups) if g in self.groups)
            if len(self._subjects) < MAX_SUBJECTS_KEPT:  # owners and their groups: few, unless a flood of names
                self._subjects[(owner, groups)] = found
        return found

    def resolve(self, asked: str, owner: str, groups: Iterable[str]) -> PriorityClass:
        """The class a job gets: the one asked for, else the owner's default. Raises ClassRefused for a class
        that does not exist or is above the owner's highest."""
        if not self.classes:
            if asked:
                raise ClassRefused(f"priority: {asked!r} is not a priority class: this cluster has none "
                                   f"(its coordinator runs without a policy that defines [classes])")
            return NO_CLASS
        default, highest = self._classes_of(owner, tuple(groups))
        name = asked or default
        if name not in self.classes:
            raise ClassRefused(f"priority: {name!r} is not a priority class (classes: {_listing(self.classes)})")
        chosen = self.classes[name]
        if chosen.value > self.classes[highest].value:
            who = f"{owner}'s" if owner else "an unnamed submitter's"
            raise ClassRefused(f"priority: {name!r} is above {who} highest class, {highest!r}")
        return chosen

    def _classes_of(self, owner: str, groups: tuple[str, ...]) -> tuple[str, str]:
        """The owner's default and highest class: their own setting, else the best their groups give, else
        the defaults. A class someone gets by default is one they may ask for."""
        def pick(attribute: str) -> str:
            own = getattr(self.users.get(owner, Limits()), attribute)
            if own:
                return own
            theirs = [getattr(self.groups[g], attribute) for g in groups if g in self.groups]
            theirs = [c for c in theirs if c]
            return max(theirs, key=lambda c: self.classes[c].value) if theirs else getattr(self.defaults, attribute)
        default, highest = pick("default_class"), pick("max_class")
        return default, max(default, highest, key=lambda c: self.classes[c].value)


NO_POLICY = Policy()


def parse(text: str, source: str, now: float = 0.0) -> Policy:
    """The policy in text (the contents of the file source names); raises PolicyError naming file, key and reason."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{source}: not valid TOML: {e}") from None
    reader = _Reader(source)
    reader.known(doc, "", ("classes", "defaults", "users", "groups"))
    classes = {name: _class(reader, f"classes.{name}", name, value)
               for name, value in reader.table(doc, "classes").items()}
    defaults_doc = reader.table(doc, "defaults")
    reader.known(defaults_doc, "defaults", ("class", "max_class", "fair_share_half_life"))
    half_life = reader.duration(defaults_doc, "defaults.fair_share_half_life", DEFAULT_HALF_LIFE_SECONDS)
    defaults = _limits(reader, defaults_doc, "defaults", classes)
    if classes and not defaults.default_class:  # the lowest class, so that nobody rises by leaving it out
        defaults = _with(defaults, default_class=min(classes.values(), key=lambda c: c.value).name)
    if classes and not defaults.max_class:
        defaults = _with(defaults, max_class=defaults.default_class)
    people = {kind: {name: _limits(reader, reader.table(reader.table(doc, kind), f"{kind}.{name}", name),
                                   f"{kind}.{name}", classes)
                     for name in reader.table(doc, kind)}
              for kind in ("users", "groups")}
    return Policy(classes=classes, defaults=defaults, fair_share_half_life=half_life, users=people["users"],
                  groups=people["groups"], text=text, source=source, loaded_at=now)


def _class(reader: "_Reader", key: str, name: str, body: object) -> PriorityClass:
    if not CLASS_NAME_RE.fullmatch(name):
        raise reader.error(key, "a class name is lowercase letters, digits, '-' and '_' (up to 63)")
    if isinstance(body, int) and not isinstance(body, bool):
        body = {"value": body}  # `high = 100` is short for `high = { value = 100 }`
    if not isinstance(body, dict):
        raise reader.error(key, f"expected {{ value = N, preemptible = true|false }}, got {body!r}")
    reader.known(body, key, ("value", "preemptible"))
    if "value" not in body:
        raise reader.error(f"{key}.value", "required: the class's number (a higher one goes first)")
    value = reader.whole(body, f"{key}.value", minimum=-(2**31), maximum=2**31 - 1)
    preemptible = body.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise reader.error(f"{key}.preemptible", f"expected true or false, got {preemptible!r}")
    return PriorityClass(name, value, preemptible)


def _limits(reader: "_Reader", body: dict, key: str, classes: Mapping[str, PriorityClass]) -> Limits:
    if key != "defaults":
        reader.known(body, key, LIMIT_KEYS)
    named = {}
    for attribute, name in (("default_class", "class"), ("max_class", "max_class")):
        value = body.get(name, "")
        if value and value not in classes:
            raise reader.error(f"{key}.{name}", f"{value!r} is not a priority class "
                                                f"(classes: {_listing(classes) if classes else 'none defined'})")
        if name in body and not (isinstance(value, str) and value):
            raise reader.error(f"{key}.{name}", f"expected the name of a class, got {value!r}")
        named[attribute] = value
    if named["default_class"] and named["max_class"] and \
            classes[named["default_class"]].value > classes[named["max_class"]].value:
        raise reader.error(f"{key}.class", f"{named['default_class']!r} is above max_class {named['max_class']!r}")
    gpu_hours = reader.number(body, f"{key}.gpu_hours") if "gpu_hours" in body else None
    window = reader.duration(body, f"{key}.window", 0.0)
    if gpu_hours is not None and not window:
        raise reader.error(f"{key}.window", "required with gpu_hours: the rolling window they are counted over, "
                                            "such as \"7d\"")
    if window and gpu_hours is None:
        raise reader.error(f"{key}.window", "goes with gpu_hours (the GPU-hours allowed within it)")
    return Limits(gpus=reader.whole(body, f"{key}.gpus") if "gpus" in body else None,
                  running_jobs=reader.whole(body, f"{key}.running_jobs") if "running_jobs" in body else None,
                  gpu_hours=gpu_hours, window_seconds=window, window=body.get("window", ""), **named)


def _with(limits: Limits, **changes) -> Limits:
    return Limits(**{**limits.__dict__, **changes})


def _listing(classes: Mapping[str, PriorityClass]) -> str:
    return ", ".join(f"{c.name} ({c.value})" for c in sorted(classes.values(), key=lambda c: -c.value))


class _Reader:
    """Reads values from the parsed document; every refusal names the file and the key."""

    def __init__(self, source: str):
        self.source = source

    def error(self, key: str, reason: str) -> PolicyError:
        return PolicyError(f"{self.source}: {key}: {reason}")

    def known(self, body: dict, where: str, keys: tuple[str, ...]) -> None:
        for key in body:
            if key not in keys:
                raise self.error(f"{where}.{key}" if where else key, f"unknown key (known: {', '.join(keys)})")

    def table(self, body: dict, key: str, name: str = "") -> dict:
        """body[name] (default: the key's last part), a table; {} when absent."""
        value = body.get(name or key.rpartition(".")[2], {})
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {value!r}")
        return value

    def whole(self, body: dict, key: str, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
        value = body[key.rpartition(".")[2]]
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            bound = f">= {minimum}" if minimum == 0 else f"between {minimum} and {maximum}"
            raise self.error(key, f"expected a whole number {bound}, got {value!r}")
        return value

    def number(self, body: dict, key: str) -> float:
        value = body[key.rpartition(".")[2]]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise self.error(key, f"expected a number >= 0, got {value!r}")
        return float(value)

    def duration(self, body: dict, key: str, default: float) -> float:
        name = key.rpartition(".")[2]
        if name not in body:
            return default
        value = body[name]
        match = DURATION_RE.fullmatch(value) if isinstance(value, str) else None
        if match is None or float(match.group(1)) <= 0:
            raise self.error(key, f"expected a duration such as \"7d\", \"12h\" or \"30m\", got {value!r}")
        return float(match.group(1)) * DURATION_UNITS[match.group(2)]
