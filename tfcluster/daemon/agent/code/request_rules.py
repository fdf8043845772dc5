"""What the files a job's environment is built from may ask for: package names with versions, from the index the
node's operator chose, and nothing else.

The agent builds an environment as root and gives it to every job that asks for the same files, so a file that
could say where packages come from (its own index, find-links, a repository, a URL, a local path) would let one
job build, from sources of its choosing, the environment another job then runs; and a path in it would be read by
uv as root. Such files are refused, saying which line and why; the operator's --uv-index-url and --uv-find-links
(or the agent's UV_INDEX_URL, UV_FIND_LINKS) are the only sources. Refusing is simpler than making the sources
part of the environment's key: what a URL or a path holds can change after the key is taken.

A requirements file may hold requirements (`name[extras] specifiers ; marker`, `--hash` after them), comments,
and the options --only-binary, --no-binary, --prefer-binary, --pre and --require-hashes. A project's
pyproject.toml may hold no direct references (`name @ URL`) in its dependencies and only the [tool.uv] settings
in UV_SETTINGS; its uv.lock only packages from the operator's index (and the project itself).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPI = "https://pypi.org/simple"
PYPI_FILES = "files.pythonhosted.org"  # where PyPI's simple pages send uv for the files
OPTIONS = frozenset({"--only-binary", "--no-binary", "--prefer-binary", "--pre", "--require-hashes"})
UV_SETTINGS = frozenset({"managed", "package", "dev-dependencies", "default-groups", "override-dependencies",
                         "constraint-dependencies", "environments", "required-environments", "conflicts",
                         "resolution", "prerelease", "exclude-newer"})
OPERATOR_ONLY = "names where packages come from, which only the node's operator does (tfcluster agent " \
                "--uv-index-url, --uv-find-links)"
_VALUED_OPTIONS = frozenset({"--only-binary", "--no-binary"})
_OPTION_VALUE = re.compile(r"[A-Za-z0-9._,:-]+")  # :all:, :none: or package names
_SOURCE_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "--no-index", "-f", "--find-links",
                             "--trusted-host", "--index", "--default-index"})
_UV_SOURCE_SETTINGS = frozenset({"index", "index-url", "extra-index-url", "find-links", "no-index", "index-strategy",
                                 "keyring-provider", "allow-insecure-host", "default-index"})
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPECIFIER = r"(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_SPECIFIERS = rf"{_SPECIFIER}(?:\s*,\s*{_SPECIFIER})*"
_REQUIREMENT = re.compile(rf"{_NAME}\s*(?:\[\s*(?:{_NAME}(?:\s*,\s*{_NAME})*)?\s*\])?"
                          rf"\s*(?:\(\s*{_SPECIFIERS}\s*\)|{_SPECIFIERS})?")
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar")
_VCS = re.compile(r"\b(git|hg|svn|bzr)\+", re.IGNORECASE)
_COMMENT = re.compile(r"(^|[ \t])#.*$")
_SHOWN = 200  # of a refused line, in the message
_LOCK_SOURCES = ("registry", "virtual", "editable", "git", "url", "path", "directory")


def requirements_problem(name: str, content: bytes) -> str:
    """Why the requirements file is refused ("": it is not): the first line it may not hold, with its number."""
    try:
        text = content.decode("utf-8-sig")  # an editor's byte order mark is no part of the first line
    except UnicodeDecodeError as e:
        return f"{name}: is not UTF-8 text (byte {e.start})"
    for number, line in logical_lines(text):
        why = line_problem(line)
        if why:
            shown = line if len(line) <= _SHOWN else line[:_SHOWN] + "..."
            return f"{name}:{number}: {shown!r}: {why}"
    return ""


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line's number, line) for each line as uv reads it: its comment ends where its line does (a
    backslash in a comment continues nothing, unlike pip), a trailing backslash continues it on the next line;
    stripped, blank ones left out. Lines are split at every line break Python knows, more than uv does: a line
    hidden from these checks in what uv would read as one line is refused with it."""
    lines, pending, first = [], "", 0
    for number, physical in enumerate(text.splitlines(), 1):
        if not pending:
            first = number
        line = _COMMENT.sub("", physical)
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        lines.append((first, (pending + line).strip()))
        pending = ""
    lines.append((first, pending.strip()))
    return [(number, line) for number, line in lines if line]


def line_problem(line: str) -> str:
    """Why one logical line of a requirements file is refused ("": it is not)."""
    if "${" in line:
        return "names an environment variable, which uv would fill in from the agent's own environment"
    if line.startswith("-"):
        return _options_problem(line.split())
    requirement, *options = re.split(r"\s+(?=-)", line, maxsplit=1)
    return dependency_problem(requirement) or _requirement_options_problem(" ".join(options).split())


def dependency_problem(requirement: str) -> str:
    """Why a requirement (PEP 508: `name[extras] specifiers ; marker`) is refused ("": it is not)."""
    if "${" in requirement:
        return "names an environment variable, which uv would fill in from the agent's own environment"
    before_marker = requirement.split(";", 1)[0].strip()
    if _VCS.search(before_marker):
        return "installs from a version-control repository; packages come only from the node's index"
    if "@" in before_marker:
        return "is a direct reference (name @ URL or path); packages come only from the node's index"
    if "://" in before_marker or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", before_marker):
        return "is a URL; packages come only from the node's index"
    if before_marker.startswith((".", "/", "~")) or "/" in before_marker or "\\" in before_marker:
        return "is a local path, which uv would read as root; packages come only from the node's index"
    if before_marker.lower().endswith(_ARCHIVES):
        return "names a local file, which uv would read as root; packages come only from the node's index"
    if not _REQUIREMENT.fullmatch(before_marker):
        return "is not a requirement (name[extras] specifiers ; marker)"
    return ""


def _options_problem(tokens: list[str]) -> str:
    """A line of options: each must be one of OPTIONS, --only-binary and --no-binary with their value."""
    expects_value = False
    for token in tokens:
        if expects_value and _OPTION_VALUE.fullmatch(token):
            expects_value = False
            continue
        option = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        why = _option_problem(option) if token.startswith("-") else f"{token!r} is neither an option nor its value"
        if why:
            return why
        expects_value = option in _VALUED_OPTIONS and "=" not in token
    return ""


def _option_problem(option: str) -> str:
    if option in OPTIONS:
        return ""
    return _source_problem(option) or \
        f"{option} is an option the agent does not take from a job (it takes {', '.join(sorted(OPTIONS))})"


def _source_problem(option: str) -> str:
    """Why an option that names where packages or files come from is refused ("": it names none)."""
    if option in _SOURCE_OPTIONS:
        return OPERATOR_ONLY
    if option in ("-r", "--requirement", "-c", "--constraint"):
        return "reads another file, which uv would read as root; list the packages in this one"
    if option in ("-e", "--editable"):
        return "installs a local path or a repository (editable); packages come only from the node's index"
    return ""


def _requirement_options_problem(tokens: list[str]) -> str:
    """After a requirement only --hash may follow (`--hash=sha256:...` or `--hash sha256:...`)."""
    expects_value = False
    for token in tokens:
        if expects_value:
            expects_value = False
        elif token == "--hash":
            expects_value = True
        elif not token.startswith("--hash="):
            option = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            return _source_problem(option) or f"{token!r} after a requirement: only --hash may follow one"
    return ""


def project_problem(name: str, content: bytes) -> str:
    """Why a project's pyproject.toml is refused ("": it is not)."""
    document, why = _toml(name, content)
    if why:
        return why
    uv = _table(_table(document, "tool"), "uv")
    for setting in uv:
        if setting not in UV_SETTINGS:
            return f"{name}: [tool.uv] {setting}: {_uv_setting_problem(setting)}"
    for where, dependency in _dependencies(document, uv):
        why = dependency_problem(dependency) if isinstance(dependency, str) else ""
        if why:
            return f"{name}: {where}: {dependency!r}: {why}"
    return ""


def _uv_setting_problem(setting: str) -> str:
    if setting in _UV_SOURCE_SETTINGS:
        return OPERATOR_ONLY
    if setting == "sources":
        return "names sources of packages (paths, URLs, repositories, indexes); packages come only from the " \
               "node's index"
    if setting == "workspace":
        return "names other projects by path, which uv would read as root"
    return f"is a setting the agent does not take from a job (it takes {', '.join(sorted(UV_SETTINGS))})"


def _dependencies(document: dict, uv: dict) -> list[tuple[str, object]]:
    """(where, requirement) for every list of requirements a pyproject.toml may hold."""
    project = _table(document, "project")
    lists = [("project.dependencies", project.get("dependencies")),
             ("build-system.requires", _table(document, "build-system").get("requires"))]
    for table, entries in (("project.optional-dependencies", project.get("optional-dependencies")),
                           ("dependency-groups", document.get("dependency-groups"))):
        if isinstance(entries, dict):
            lists += [(f"{table}.{key}", value) for key, value in entries.items()]
    lists += [(f"tool.uv.{key}", uv.get(key)) for key in ("dev-dependencies", "override-dependencies",
                                                          "constraint-dependencies")]
    return [(where, item) for where, items in lists if isinstance(items, list) for item in items]


def lock_problem(name: str, content: bytes, indexes: tuple[str, ...]) -> str:
    """Why a uv.lock is refused ("": it is not): each package must come from one of the operator's indexes,
    its files from that index's host (PyPI's from files.pythonhosted.org), or be the project itself."""
    document, why = _toml(name, content)
    if why:
        return why
    allowed = {index.rstrip("/") for index in indexes}
    packages = [entry for key in ("package", "distribution")  # "distribution": what early locks called them
                if isinstance(document.get(key), list) for entry in document[key]]
    for package in packages:
        where = f"{name}: package {package.get('name', '?')!r}" if isinstance(package, dict) else name
        source = package.get("source") if isinstance(package, dict) else None
        kinds = [kind for kind in _LOCK_SOURCES if kind in source] if isinstance(source, dict) else []
        if len(kinds) != 1:
            return f"{where}: names no one source of the kinds uv writes ({', '.join(_LOCK_SOURCES)}): {source!r}"
        kind, value = kinds[0], source[kinds[0]]
        if kind in ("virtual", "editable") and value == ".":
            continue  # the project itself, which is never installed (uv sync --no-install-project)
        if kind != "registry":
            return f"{where}: comes from {kind} {value!r}; packages come only from the node's index"
        if not isinstance(value, str) or value.rstrip("/") not in allowed:
            named = ", ".join(sorted(allowed)) or "none"
            return f"{where}: comes from the index {value!r}, which is not one the node's operator named ({named})"
        why = _files_problem(package, value)
        if why:
            return f"{where}: {why}"
    return ""


def _files_problem(package: dict, registry: str) -> str:
    host = urlsplit(registry).hostname or ""
    hosts = {host, PYPI_FILES} if host == urlsplit(PYPI).hostname else {host}
    files = [package.get("sdist")] + (package.get("wheels") if isinstance(package.get("wheels"), list) else [])
    for file in files:
        if file is None:
            continue
        url = file.get("url") if isinstance(file, dict) else None
        if not isinstance(url, str):
            return f"names a file by path, not by its index's URL: {file!r}"
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or parts.hostname not in hosts:
            return f"names a file at {url!r}, not at its index ({', '.join(sorted(hosts))})"
    return ""


def _table(table: dict, key: str) -> dict:
    """table[key] where it is a table, else an empty one (uv itself refuses a file where it is something else)."""
    value = table.get(key)
    return value if isinstance(value, dict) else {}


def _toml(name: str, content: bytes) -> tuple[dict, str]:
    try:
        return tomllib.loads(content.decode("utf-8")), ""
    except UnicodeDecodeError as e:
        return {}, f"{name}: is not UTF-8 text (byte {e.start})"
    except tomllib.TOMLDecodeError as e:
        return {}, f"{name}: is not TOML: {e}"
