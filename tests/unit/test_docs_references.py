"""No code, manual page or README refers to a file of the repository that does not exist.

A reference is a relative link in Markdown, or a path-like mention (`docs/tensorflow.md`, `restart.py`,
`tfcluster/v1/agent.proto`) in the manual, the README, Python comments and docstrings, and the comments of
unit files and configuration. A mention with a directory resolves against the mentioning file's directory,
the repository root, or as the tail of any repository path (the manual says `daemon/agent/hooks/shipping.py` for
`tfcluster/daemon/agent/hooks/shipping.py`); a bare name resolves when a file of that name exists anywhere in the
repository. Links in Markdown must also name a heading that exists in the page they point to.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("tfcluster", "tests", "bench", "scripts", "systemd", "deploy", "examples", "docs")
SCANNED_FILES = ("README.md", "Makefile", "mkdocs.yml", "pyproject.toml", ".ci/run")
SKIPPED_DIRS = {".git", ".venv", "build", "site", "__pycache__", ".hypothesis", "test-artifacts", "node_modules"}
# Generated from protos/: their comments are the .proto files' own, checked there.
GENERATED = ("tfcluster/api/",)

EXTENSIONS = ("md", "py", "proto", "toml", "service")
MENTION = re.compile(r"(?<![\w./$<>*-])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:%s))(?![\w/])" % "|".join(EXTENSIONS))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
# Names a user's own files go by in the manual's examples (a job spec, a training script), not files of this
# repository.
USER_FILES = {"job.toml", "spec.toml", "SPEC.toml", "policy.toml", "sweep.toml", "train.py", "main.py"}
# TensorFlow's API paths can end like a file name (tf.data.experimental.service): a module, not a file.
TF_API = "tf."


def repo_files(root: Path) -> list[str]:
    """Every file of the checkout, as a path relative to the root, less build outputs and the venv."""
    found = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]  # not walked at all
        found += [(Path(top) / name).relative_to(root).as_posix() for name in names]
    return found


def scanned(root: Path, files: list[str]) -> list[str]:
    chosen = [f for f in files if f.split("/")[0] in SCANNED_DIRS or f in SCANNED_FILES]
    return sorted(f for f in chosen if not f.startswith(GENERATED) and Path(f).suffix not in (".png", ".json"))


def python_prose(source: str) -> str:
    """The comments and docstrings of a Python file: where it names other files in prose."""
    pieces, previous = [], tokenize.INDENT
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                pieces.append(token.string)
            elif token.type == tokenize.STRING and previous in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL,
                                                                 tokenize.DEDENT, tokenize.ENCODING):
                pieces.append(token.string)
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                previous = token.type
    except (tokenize.TokenError, SyntaxError) as e:
        raise AssertionError(f"cannot tokenize: {e}") from e
    return "\n".join(pieces)


def hash_comments(source: str) -> str:
    return "\n".join(line.split("#", 1)[1] for line in source.splitlines() if "#" in line)


def mentions(path: str, text: str) -> list[str]:
    """Path-like mentions of repository files in one file's prose."""
    if not MENTION.search(text):
        return []  # nothing that looks like a file name: no need to tokenize
    if path.endswith(".py"):
        prose = python_prose(text)
    elif path.endswith(".md"):
        prose = text  # code blocks too: the manual's layout of the code names every module
    else:
        prose = hash_comments(text)
    prose = URL.sub("", prose)
    return [m for m in MENTION.findall(prose) if m not in USER_FILES and not m.startswith(TF_API)]


def markdown_links(text: str) -> list[str]:
    """Relative link targets of a Markdown file, outside fenced blocks (web links are not checked here)."""
    return [t for t in LINK.findall(FENCE.sub("", text)) if not URL.match(t) and not t.startswith("mailto:")]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs make it, unless the heading gives its own with {#id}."""
    explicit = re.search(r"\{#([\w-]+)\}\s*$", heading)
    if explicit:
        return explicit.group(1)
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", markdown))}


def resolves(mention: str, where: str, files: list[str], names: set[str]) -> bool:
    if "/" not in mention:
        return mention in names
    here = (Path(where).parent / mention).as_posix()
    candidates = {mention, here, str(Path(here)).replace("\\", "/")}
    return any(c in files for c in candidates) or any(f.endswith("/" + mention) for f in files)


def broken_references(root: Path) -> list[str]:
    """'FILE: REFERENCE' for every reference in the scanned files that names no file of the repository."""
    files = repo_files(root)
    names = {f.rsplit("/", 1)[-1] for f in files}
    broken = []
    for path in scanned(root, files):
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        for mention in mentions(path, text):
            if not resolves(mention, path, files, names):
                broken.append(f"{path}: {mention}")
        if path.endswith(".md"):
            broken += [f"{path}: {link}" for link in markdown_links(text) if not link_resolves(root, path, link)]
    return broken


def link_resolves(root: Path, page: str, link: str) -> bool:
    target, _, anchor = link.partition("#")
    if not target:
        return not anchor or anchor in anchors((root / page).read_text(encoding="utf-8"))
    resolved = (root / page).parent / target
    if not resolved.resolve().is_relative_to(root.resolve()) or not resolved.exists():
        return False  # missing, or outside the repository
    if resolved.is_dir():
        return True
    return not anchor or not target.endswith(".md") or anchor in anchors(resolved.read_text(encoding="utf-8"))


def test_every_referenced_file_exists():
    broken = broken_references(ROOT)
    assert not broken, "references to files that are not in the repository:\n" + "\n".join(broken)


def test_the_references_checked_include_code_docs_and_links():
    """The scan sees what it must: docstrings and comments, the manual, and the README's links."""
    files = repo_files(ROOT)
    chosen = scanned(ROOT, files)
    assert "README.md" in chosen and "docs/architecture.md" in chosen and "tfcluster/cli/__init__.py" in chosen
    assert "docs/tensorflow.md" in mentions("tests/unit/test_docs_references.py", Path(__file__).read_text())
    assert "docs/index.md" in markdown_links((ROOT / "README.md").read_text())


def small_repository(root: Path, extra: dict[str, str]) -> None:
    """A page with headings, a module and a unit file, plus the files under test."""
    present = dict.fromkeys(("docs/architecture.md", "tfcluster/roles/tfconfig.py", "systemd/tfcluster-agent.service"),
                            "# Architecture\n\n## States\n")
    for path, text in {**present, **extra}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


@pytest.mark.parametrize("path, text", [
    ("tfcluster/example.py", '"""The rules are in ROADMAP.md."""\nx = 1\n'),
    ("tfcluster/example.py", "x = 1  # see HISTORY.md: why\n"),
    ("tfcluster/example.py", "def f():\n    '''As actions.py does.'''\n"),
    ("docs/page.md", "The facts are in `FACTS.md`.\n"),
    ("docs/page.md", "See [the design](design.md).\n"),
    ("docs/page.md", "See [states](architecture.md#no-such-heading).\n"),
    ("README.md", "See [the manual](docs/missing.md).\n"),
    ("systemd/extra.service", "# see tfcluster-agent.conf.service for the rest\n"),
])
def test_a_reference_to_a_missing_file_is_found(tmp_path, path, text):
    small_repository(tmp_path, {path: text})
    assert broken_references(tmp_path), text


@pytest.mark.parametrize("path, text", [
    ("tfcluster/example.py", '"""TF_CONFIG as docs/architecture.md says; built in roles/tfconfig.py."""\n'),
    ("tfcluster/example.py", "x = 'ROADMAP.md'  # a string in code is data, not a reference\n"),
    ("docs/page.md", "See [states](architecture.md#states) and `tfconfig.py`.\n\n```sh\ncat job.toml\n```\n"),
    ("README.md", "See [the manual](docs/architecture.md#states) and [systemd](systemd/).\n"),
])
def test_a_reference_to_an_existing_file_passes(tmp_path, path, text):
    small_repository(tmp_path, {path: text})
    assert broken_references(tmp_path) == []
