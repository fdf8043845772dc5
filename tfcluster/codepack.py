"""A job's code as one archive: the spec's workdir packed so that the same tree always gives the same bytes.

The archive is a gzip'd tar with its members sorted by path, every mtime, uid and gid fixed, owner names
empty and modes reduced to 0644 / 0755 (executable or not), and a gzip header without a time or a name:
its sha256 names the tree, so a tree the coordinator already holds is not sent again, however often its
files were touched. Left out: `.git`, what `.gitignore` and `.tfclusterignore` files exclude (git's own
rules, through `pathspec`; a file in a folder applies to that folder), and the paths the caller names (the
job's own output folders). A workdir inside a git working tree also obeys the repository's rules above it,
as git would: the ignore files from the repository's top down, and its info/exclude. A symbolic link is
kept only if it points inside the tree; one that leaves it is refused, by name, rather than sent as a path
that means something else on every node. Pure: files in, an archive file out; no sockets.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".tfclusterignore")
ALWAYS_LEFT_OUT = frozenset({".git"})
DEFAULT_MAX_BYTES = 256 << 20
LARGEST_SHOWN = 5
SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")
_COPY_CHUNK = 1 << 20


class PackError(Exception):
    """The tree cannot be packed: what is wrong, in one line a person can act on."""


class OverCap(PackError):
    """The archive would be larger than the cap it was packed under."""


@dataclass(frozen=True)
class Entry:
    path: str        # relative, '/'-separated
    kind: str        # "file", "dir" or "link"
    size: int = 0
    executable: bool = False
    target: str = ""  # a link's target, relative to the link's folder
    mtime_ns: int = 0  # not in the archive: it tells a tree already packed from one that changed (fingerprint)


@dataclass(frozen=True)
class Archive:
    path: Path       # a temporary file; the caller removes it (remove())
    sha256: str      # "sha256:<hex>"
    size: int        # bytes of the archive
    files: int       # regular files in it
    tree_bytes: int  # what its files add up to, unpacked

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def summary(self) -> str:
        return summary(self.files, self.tree_bytes, self.sha256)


def summary(files: int, tree_bytes: int, sha256: str) -> str:
    """`41 files, 1.2 MB, sha256:ab12...`: the size said is the tree's, as the user knows their files."""
    return f"{files} file{'s' if files != 1 else ''}, {human_bytes(tree_bytes)}, {sha256[:19]}..."


# ---- what goes in -------------------------------------------------------------------------------

class _Ignores:
    """The ignore files met on the way down: each folder's rules, applied to paths below it. Paths are matched
    from the top of the enclosing git repository (prefix: the workdir's path from there), as git matches them."""

    def __init__(self, rules: tuple[tuple[str, pathspec.PathSpec], ...] = (), prefix: str = ""):
        self.rules, self.prefix = rules, prefix

    def below(self, folder: Path, rel: str) -> "_Ignores":
        """With the ignore files of folder (rel: its path from the workdir) added."""
        return self.adding(_ignore_lines(folder, rel), _joined(self.prefix, rel))

    def adding(self, lines: list[str], base: str) -> "_Ignores":
        if not lines:
            return self
        return _Ignores(self.rules + ((base, pathspec.GitIgnoreSpec.from_lines(lines)),), self.prefix)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether a path from the workdir is left out."""
        return self.leaves_out(_joined(self.prefix, rel), is_dir)

    def leaves_out(self, path: str, is_dir: bool) -> bool:
        """Whether a path from the repository's top is left out: the last rule that speaks of the path decides,
        deeper folders' rules after their parents' (git's)."""
        verdict = False
        for base, spec in self.rules:
            inside = path[len(base) + 1:] if base else path
            result = spec.check_file(inside + "/" if is_dir else inside)
            if result.include is not None:
                verdict = result.include
        return verdict


def _joined(base: str, rel: str) -> str:
    return f"{base}/{rel}" if base and rel else base or rel


def _ignore_lines(folder: Path, shown: str) -> list[str]:
    lines: list[str] = []
    for name in IGNORE_FILES:
        lines += _lines(folder / name, f"{shown}/{name}" if shown else name)
    return lines


def _lines(path: Path, shown: str) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
    except OSError as e:
        raise PackError(f"cannot read {shown}: {e.strerror or e}") from None


def _repository_ignores(real_root: Path) -> _Ignores:
    """What the git repository around the workdir leaves out of it: its info/exclude, then the ignore files from
    its top down to the workdir's parent, each for the paths below its folder. Nothing outside a repository,
    and nothing when these rules leave out the workdir itself: git would see none of it, but the spec names it."""
    top = next((folder for folder in (real_root, *real_root.parents) if os.path.lexists(folder / ".git")), None)
    if top is None:
        return _Ignores()
    prefix = real_root.relative_to(top).as_posix()
    ignores = _Ignores(prefix="" if prefix == "." else prefix)
    git_dir = _git_dir(top)
    if git_dir is not None:
        ignores = ignores.adding(_lines(git_dir / "info" / "exclude", str(git_dir / "info" / "exclude")), "")
    folder, base = top, ""
    for part in Path(ignores.prefix).parts:
        ignores = ignores.adding(_ignore_lines(folder, str(folder)), base)
        folder, base = folder / part, _joined(base, part)
        if ignores.leaves_out(base, is_dir=True):
            return _Ignores()
    return ignores


def _git_dir(top: Path) -> Path | None:
    """The folder holding the repository's info/exclude: .git itself, or where a `.git` file's `gitdir:` line
    points (a submodule, a worktree: whose own `commondir` names the main repository's, where git reads it)."""
    dot_git = top / ".git"
    if dot_git.is_dir():
        return dot_git
    try:
        lines = dot_git.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    pointed = next((line[len("gitdir:"):].strip() for line in lines if line.startswith("gitdir:")), "")
    if not pointed:
        return None
    git_dir = top / pointed
    try:
        return git_dir / (git_dir / "commondir").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return git_dir


def collect(root: str | Path, leave_out: Iterable[str] = ()) -> list[Entry]:
    """Every entry that goes into the archive, sorted by path; leave_out: paths from the root ('/'-separated)
    left out whatever the ignore files say. Raises PackError (a link that leaves the tree, a folder that cannot
    be read, a root that is not a folder)."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"the workdir {root} is not a folder")
    real_root = root.resolve()
    entries: list[Entry] = []
    ignores = _repository_ignores(real_root).below(root, "")
    _walk(root, "", ignores, real_root, frozenset(leave_out), entries)
    entries.sort(key=lambda e: e.path)
    return entries


def _walk(folder: Path, rel: str, ignores: _Ignores, real_root: Path, leave_out: frozenset[str],
          entries: list[Entry]) -> bool:
    """Adds what the folder holds; False when it was removed before it could be listed."""
    try:
        listing = sorted(os.scandir(folder), key=lambda d: d.name)
    except FileNotFoundError:
        if rel:
            return False  # removed while the tree was walked (another job's temporary folder): not in the tree now
        raise PackError("cannot read .: the workdir was removed while it was packed") from None
    except OSError as e:
        raise PackError(f"cannot read {rel or '.'}: {e.strerror or e}") from None
    for item in listing:
        path = f"{rel}/{item.name}" if rel else item.name
        if item.name in ALWAYS_LEFT_OUT or path in leave_out:
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since the folder was listed
        is_dir = stat.S_ISDIR(info.st_mode)
        if ignores.ignored(path, is_dir):
            continue
        if stat.S_ISLNK(info.st_mode):
            entries.append(_link(Path(item.path), path, real_root))
        elif is_dir:
            entries.append(Entry(path, "dir"))
            if not _walk(Path(item.path), path, ignores.below(Path(item.path), path), real_root, leave_out, entries):
                entries.pop()  # gone before it was listed: its entry too
        elif stat.S_ISREG(info.st_mode):
            entries.append(Entry(path, "file", info.st_size, bool(info.st_mode & 0o111), mtime_ns=info.st_mtime_ns))
        # sockets, fifos and devices are not code: left out
    return True


def _link(link: Path, rel: str, real_root: Path) -> Entry:
    target = Path(os.path.realpath(link))  # where it leads, through every link on the way
    if target != real_root and real_root not in target.parents:
        raise PackError(f"{rel} is a symbolic link to {os.readlink(link)}, outside the workdir: the nodes would "
                        f"not have what it points to (copy it in, or leave it out in .tfclusterignore)")
    return Entry(rel, "link", target=os.path.relpath(target, real_root / Path(rel).parent))


# ---- the archive --------------------------------------------------------------------------------

class _Capped:
    """A file that refuses to grow past a cap, and hashes what it is given."""

    def __init__(self, out, cap: int):
        self.out, self.cap, self.written, self.hash = out, cap, 0, hashlib.sha256()

    def write(self, data) -> int:
        self.written += len(data)
        if self.written > self.cap:
            raise _Full()
        self.hash.update(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


class _Full(Exception):
    pass


def pack(root: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, entries: list[Entry] | None = None,
         leave_out: Iterable[str] = ()) -> Archive:
    """Packs the tree (entries: what collect() gave, else collected here) into a temporary file. Raises PackError:
    what collect() refuses, or an archive over max_bytes (the message lists the largest files, what to leave out
    first)."""
    root = Path(root)
    entries = collect(root, leave_out) if entries is None else entries
    fd, name = tempfile.mkstemp(prefix="tfcluster-code-", suffix=".tar.gz")
    try:
        with os.fdopen(fd, "wb") as raw:
            capped = _Capped(raw, max_bytes)
            with gzip.GzipFile(filename="", mode="wb", fileobj=capped, mtime=0, compresslevel=6) as zipped, \
                    tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
                entries = [entry for entry in entries if _add(tar, root, entry)]
    except _Full:
        os.unlink(name)
        raise OverCap(over_cap_message(entries, max_bytes)) from None
    except BaseException:
        os.unlink(name)
        raise
    files = [e for e in entries if e.kind == "file"]
    return Archive(Path(name), f"sha256:{capped.hash.hexdigest()}", capped.written, len(files),
                   sum(e.size for e in files))


def _add(tar: tarfile.TarFile, root: Path, entry: Entry) -> bool:
    """Adds the entry; False for a file removed since the walk (a checkpoint's temporary file another job
    deleted meanwhile), which the archive then does not hold, as if the walk had come after."""
    info = tarfile.TarInfo(entry.path)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if entry.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    elif entry.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.target
        tar.addfile(info)
    else:
        info.mode = 0o755 if entry.executable else 0o644
        try:
            with open(root / entry.path, "rb") as f:
                info.size = os.fstat(f.fileno()).st_size  # what is read, if it changed since the walk
                tar.addfile(info, f)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise PackError(f"cannot read {entry.path}: {e.strerror or e}") from None
    return True


def over_cap_message(entries: list[Entry], max_bytes: int) -> str:
    """`code: 412 MB is over the coordinator's cap of 256 MiB; largest: data/big.bin 400 MB, ...`"""
    files = [e for e in entries if e.kind == "file"]
    largest = sorted(files, key=lambda e: (-e.size, e.path))[:LARGEST_SHOWN]
    shown = ", ".join(f"{e.path} {human_bytes(e.size)}" for e in largest)
    return (f"code: {human_bytes(sum(e.size for e in files))} is over the coordinator's cap of "
            f"{binary_bytes(max_bytes)}; largest: {shown}{', ...' if len(files) > LARGEST_SHOWN else ''} "
            f"(leave what the job does not need out in .tfclusterignore, or set shared_workdir = true "
            f"if the workdir is on storage every node shares)")


def fingerprint(root: str | Path, entries: list[Entry], leave_out: Iterable[str] = ()) -> str:
    """What the tree looks like from its listing (paths, sizes, modes, modification times, links) and what was
    left out of it: a tree whose fingerprint is unchanged since it was packed packs to the same archive, as
    git's index assumes."""
    left_out = "\0".join(sorted(leave_out))
    digest = hashlib.sha256(f"{Path(root).resolve()}\n{left_out}\n".encode())
    for e in entries:
        digest.update(f"{e.path}\0{e.kind}\0{e.size}\0{e.executable:d}\0{e.target}\0{e.mtime_ns}\n".encode())
    return digest.hexdigest()


def tree_bytes(entries: list[Entry]) -> int:
    return sum(e.size for e in entries if e.kind == "file")


def human_bytes(n: int) -> str:
    """Decimal units, as file managers show sizes: 900 B, 12.3 kB, 1.2 MB, 412 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    return f"{n} B"


def binary_bytes(n: int) -> str:
    """A cap as it was set: 256 MiB, 1 GiB (or bytes when it is not a whole number of either)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return human_bytes(n)
