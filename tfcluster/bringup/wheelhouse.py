"""The software `up` installs: a wheelhouse built from this checkout (tfcluster's wheel and every dependency's, for
the hosts' Python), so that hosts install with `pip --no-index` and need no package index. Built once per source
and target and kept in the operator's cache: a later `up` of the same checkout builds nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tfcluster
from tfcluster.bringup.inventory import Software

SOURCE_FILES = ("pyproject.toml", "README.md")


class WheelhouseError(Exception):
    pass


def checkout() -> Path | None:
    """The source tree this tfcluster runs from, when it runs from one (an editable install or a clone)."""
    root = Path(tfcluster.__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "tfcluster").is_dir() else None


def source_digest(root: Path) -> str:
    """A hash of what the wheel is built from: the package's files and the project's metadata."""
    digest = hashlib.sha256()
    paths = [root / name for name in SOURCE_FILES if (root / name).exists()]
    paths += sorted(p for p in (root / "tfcluster").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def software_id(software: Software, python: str, machine: str, root: Path | None) -> str:
    """What a host's virtualenv is marked with once installed: the release, and what it was built from for."""
    if software.source == "index":
        return f"{tfcluster.__version__} from {software.index_url} extras {','.join(software.extras) or '-'}"
    assert root is not None
    key = hashlib.sha256(f"{source_digest(root)} {','.join(software.extras)} {python} {machine}".encode())
    return f"{tfcluster.__version__}+{key.hexdigest()[:16]}"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfcluster" / "wheelhouses"


def wheelhouse(software: Software, python: str, machine: str) -> tuple[Path, str]:
    """The built wheelhouse for hosts of this Python (X.Y) and machine, and its software id."""
    root = checkout()
    if root is None:
        raise WheelhouseError("tfcluster runs from no source checkout here, so there is nothing to build a "
                              "wheelhouse from; remedy: run `tfcluster up` from a clone, or set [software] "
                              "source = \"index\" and index_url")
    ident = software_id(software, python, machine, root)
    target = cache_dir() / ident
    if (target / ".complete").exists():
        return target, ident
    building = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    project = f"{root}[{','.join(software.extras)}]" if software.extras else str(root)
    if python == "%d.%d" % sys.version_info[:2] and machine == os.uname().machine:
        _pip("wheel", "--wheel-dir", str(building), project)
    else:
        _pip("wheel", "--no-deps", "--wheel-dir", str(building), str(root))
        _pip("download", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
             "--platform", f"manylinux2014_{machine}", "--dest", str(building), project)
    (building / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    return target, ident


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
                          capture_output=True, text=True)
    if done.returncode:
        raise WheelhouseError(f"pip {args[0]} failed: {(done.stderr or done.stdout).strip()[-1500:]}; remedy: "
                              f"fix what pip says, or set [software] source = \"index\" and index_url")
