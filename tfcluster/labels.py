"""Node labels: the kinds of machine an agent says its node is (`--label a100`), which a role may ask for
(`labels = ["a100"]`) and an inventory may set (`labels = [...]` per node). One rule for all three.

A label is a name (`a100`, `nvlink`) or a key and a value (`gpu=a100`, `rack=r12`): each part starts and ends with
a lowercase letter or digit and holds only lowercase letters, digits, '.', '_' and '-'; one '=' at most; 63
characters in all (as a Kubernetes label value). Lowercase only, so `A100` and `a100` can never be two kinds. A
node has at most MAX_LABELS of them, a role asks for at most as many, and neither lists one twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_LABELS = 32
MAX_LABEL_LENGTH = 63
_PART = r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?"
LABEL_RE = re.compile(rf"{_PART}(?:={_PART})?")
LABEL_RULE = ("lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit, "
              f"optionally key=value, at most {MAX_LABEL_LENGTH} characters")


def label_problem(labels: Iterable[str]) -> str:
    """What is wrong with these labels, in words; "": nothing. The caller names where they came from."""
    labels = list(labels)
    if len(labels) > MAX_LABELS:
        return f"expected at most {MAX_LABELS} labels, got {len(labels)}"
    for label in labels:
        if not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH or not LABEL_RE.fullmatch(label):
            shown = label[:80] if isinstance(label, str) else label
            return f"expected labels of {LABEL_RULE}, got {shown!r}"
    if len(set(labels)) != len(labels):
        return "lists a label twice"
    return ""


def missing(wanted: Iterable[str], held: Iterable[str]) -> list[str]:
    """The wanted labels a node does not hold, in the order asked."""
    have = set(held)
    return [label for label in wanted if label not in have]
