"""What a job's requirements file, pyproject.toml and uv.lock may ask for: packages by name from the operator's
index. Every way to name another source (an index, find-links, a repository, a URL, a path, another file, an
environment variable) is refused with its line and why, however the line is written."""

from __future__ import annotations

import pytest

from tfcluster.daemon.agent.code.request_rules import (OPERATOR_ONLY, PYPI, line_problem, lock_problem, logical_lines,
                                                 project_problem, requirements_problem)


@pytest.mark.parametrize("line", [
    "tinypkg", "tinypkg==1.0", "numpy>=1.24,<2", "Foo_Bar.baz[extra1, extra2] (>=1.0)", "pkg~=1.4.2", "pkg!=1.5.*",
    "tensorflow[and-cuda]==2.21.0 ; sys_platform == 'linux' and python_version >= '3.10'", "pkg===1.0+local",
    "pkg==1.0 --hash=sha256:abcd --hash sha256:ef01", "--only-binary :all:", "--only-binary=:all:",
    "--no-binary :none:", "--prefer-binary", "--pre", "--require-hashes",
])
def test_packages_by_name_and_harmless_options_are_taken(line):
    assert line_problem(line) == ""


@pytest.mark.parametrize("line, why", [
    ("--index-url https://evil.example/simple", OPERATOR_ONLY),
    ("--index-url=https://evil.example/simple", OPERATOR_ONLY),
    ("-i https://evil.example/simple", OPERATOR_ONLY),
    ("-ihttps://evil.example/simple", OPERATOR_ONLY),
    ("--extra-index-url https://x", OPERATOR_ONLY),
    ("-f /tmp/wheels", OPERATOR_ONLY),
    ("--find-links=/tmp/wheels", OPERATOR_ONLY),
    ("--trusted-host evil.example", OPERATOR_ONLY),
    ("--no-index", OPERATOR_ONLY),
    ("--pre --extra-index-url https://x", OPERATOR_ONLY),  # a harmless option first hides nothing
    ("tinypkg --index-url https://x", OPERATOR_ONLY),  # after a requirement too
    ("-r /etc/shadow", "reads another file"),
    ("--requirement=other.txt", "reads another file"),
    ("-c constraints.txt", "reads another file"),
    ("-e .", "editable"),
    ("--editable=git+https://x/y", "editable"),
    ("git+https://github.com/x/y.git", "version-control repository"),
    ("pkg @ git+https://github.com/x/y.git@main", "version-control repository"),
    ("hg+https://x/y", "version-control repository"),
    ("pkg @ file:///x", "direct reference"),
    ("pkg[extra]@https://evil.example/pkg.whl", "direct reference"),
    ("https://evil.example/pkg-1.0-py3-none-any.whl", "is a URL"),
    ("file:pkg", "is a URL"),
    ("./local-pkg", "local path"),
    ("/opt/wheels/pkg-1.0-py3-none-any.whl", "local path"),
    ("~/pkg", "local path"),
    ("sub/dir", "local path"),
    ("pkg-1.0-py3-none-any.whl", "local file"),
    ("${TFCLUSTER_JOIN_TOKEN}", "environment variable"),
    ("tinypkg==${VERSION}", "environment variable"),
    ("--use-feature=truststore", "an option the agent does not take"),
    ("--only-binary /etc", "neither an option nor its value"),
    ("pkg --install-option=--prefix=/etc", "only --hash may follow"),
    ("pkg; python_version >= '3' --config-settings x=y", "only --hash may follow"),
    ("not a requirement!", "is not a requirement"),
])
def test_every_other_source_is_refused(line, why):
    assert why in line_problem(line)


def test_the_refusal_names_the_file_the_line_and_its_number():
    content = b"# packages\ntinypkg==1.0\n\n--extra-index-url https://x\n"
    assert requirements_problem("reqs/train.txt", content) == \
        f"reqs/train.txt:4: '--extra-index-url https://x': {OPERATOR_ONLY}"
    assert requirements_problem("r.txt", b"tinypkg\nnumpy>=1.24 # pinned below 2 in CI\n") == ""


def test_lines_are_read_as_uv_reads_them():
    """A backslash in a comment continues nothing for uv (it would for pip): the next line is a line of its
    own, and an option there is seen; a continued requirement carries its hashes."""
    assert requirements_problem("r.txt", b"tinypkg # \\\n--index-url https://x\n").startswith("r.txt:2: ")
    assert requirements_problem("r.txt", b"tinypkg \\\n  --index-url https://x\n").startswith("r.txt:1: ")
    compiled = b"numpy==1.26.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\n    # via -r requirements.in\n"
    assert requirements_problem("r.txt", compiled) == ""
    assert logical_lines("a\n\n b \\\nc\n#x\nd #e\nf#g\nh\\") == [(1, "a"), (3, "b c"), (6, "d"), (7, "f#g"),
                                                                  (8, "h")]


def test_line_breaks_python_knows_and_uv_may_not_hide_nothing():
    assert requirements_problem("r.txt", b"# a comment\r--index-url https://x\n").startswith("r.txt:2: ")
    assert "--index-url" in requirements_problem("r.txt", "# a comment\u2028--index-url https://x\n".encode())


def test_a_file_that_is_not_text_is_refused():
    assert requirements_problem("r.txt", b"tinypkg\n\xff\xfe") == "r.txt: is not UTF-8 text (byte 8)"


PROJECT = b'[project]\nname = "p"\nversion = "0"\ndependencies = ["tinypkg>=1"]\n'


@pytest.mark.parametrize("extra", [
    b"[tool.uv]\nmanaged = true\ndev-dependencies = ['pytest']\n",
    b"[dependency-groups]\ndev = [{include-group = 'test'}, 'pytest']\ntest = ['tinypkg']\n",
    b"[project.optional-dependencies]\ngpu = ['tensorflow[and-cuda]==2.21.0']\n",
])
def test_a_plain_project_is_taken(extra):
    assert project_problem("pyproject.toml", PROJECT + extra) == ""


@pytest.mark.parametrize("extra, why", [
    (b"[tool.uv.sources]\ntinypkg = { path = '/tmp/x' }\n", "[tool.uv] sources: names sources of packages"),
    (b"[[tool.uv.index]]\nname = 'evil'\nurl = 'https://evil.example/simple'\n", f"[tool.uv] index: {OPERATOR_ONLY}"),
    (b"[tool.uv]\nindex-url = 'https://evil.example/simple'\n", f"[tool.uv] index-url: {OPERATOR_ONLY}"),
    (b"[tool.uv]\nextra-index-url = ['https://x']\n", f"[tool.uv] extra-index-url: {OPERATOR_ONLY}"),
    (b"[tool.uv]\nfind-links = ['/tmp/wheels']\n", f"[tool.uv] find-links: {OPERATOR_ONLY}"),
    (b"[tool.uv.workspace]\nmembers = ['/etc/*']\n", "[tool.uv] workspace: names other projects by path"),
    (b"[tool.uv]\ncache-dir = '/etc'\n", "[tool.uv] cache-dir: is a setting the agent does not take"),
    (b"[tool.uv]\ndev-dependencies = ['x @ https://evil.example/x.whl']\n",
     "tool.uv.dev-dependencies: 'x @ https://evil.example/x.whl': is a direct reference"),
    (b"[dependency-groups]\ndev = ['git+https://x/y']\n", "dependency-groups.dev: 'git+https://x/y': installs from"),
    (b"[project.optional-dependencies]\nx = ['./local']\n", "project.optional-dependencies.x: './local': is a local"),
    (b"[build-system]\nrequires = ['backend @ file:///tmp/b']\n", "build-system.requires: 'backend @ file:///tmp/b'"),
])
def test_a_project_that_names_its_own_sources_is_refused(extra, why):
    assert why in project_problem("app/pyproject.toml", PROJECT + extra)


def test_a_direct_reference_among_the_dependencies_is_refused():
    project = PROJECT.replace(b'"tinypkg>=1"', b'"tinypkg @ file:///x"')
    assert project_problem("pyproject.toml", project) == \
        "pyproject.toml: project.dependencies: 'tinypkg @ file:///x': is a direct reference (name @ URL or path); " \
        "packages come only from the node's index"
    assert project_problem("pyproject.toml", b"[project\n").startswith("pyproject.toml: is not TOML: ")


def lock(source: str, files: str = "") -> bytes:
    return (f'version = 1\n[[package]]\nname = "p"\nversion = "0"\nsource = {{ virtual = "." }}\n'
            f'[[package]]\nname = "tinypkg"\nversion = "1.0"\nsource = {source}\n{files}').encode()


PYPI_WHEEL = 'wheels = [{ url = "https://files.pythonhosted.org/packages/t/tinypkg-1.0-py3-none-any.whl" }]\n'


def test_a_lock_from_the_operators_index_is_taken():
    assert lock_problem("uv.lock", lock('{ registry = "https://pypi.org/simple" }', PYPI_WHEEL), (PYPI + "/",)) == ""
    mirror = 'sdist = { url = "https://mirror.example/files/tinypkg-1.0.tar.gz" }\n'
    assert lock_problem("uv.lock", lock('{ registry = "https://mirror.example/simple/" }', mirror),
                        ("https://mirror.example/simple",)) == ""


@pytest.mark.parametrize("source, files, why", [
    ('{ registry = "https://evil.example/simple" }', "", "comes from the index 'https://evil.example/simple', "
                                                         "which is not one the node's operator named"),
    ('{ registry = "../wheels" }', 'wheels = [{ path = "tinypkg-1.0-py3-none-any.whl" }]\n', "comes from the index"),
    ('{ registry = "https://pypi.org/simple" }', 'wheels = [{ url = "https://evil.example/t.whl" }]\n',
     "names a file at 'https://evil.example/t.whl', not at its index (files.pythonhosted.org, pypi.org)"),
    ('{ registry = "https://pypi.org/simple" }', 'wheels = [{ path = "/etc/shadow" }]\n', "names a file by path"),
    ('{ registry = "https://pypi.org/simple" }', 'wheels = [{ url = "file:///etc/shadow" }]\n', "names a file at"),
    ('{ git = "https://github.com/x/y?rev=main#abc" }', "", "comes from git"),
    ('{ url = "https://evil.example/t.whl" }', "", "comes from url"),
    ('{ path = "/tmp/t.whl" }', "", "comes from path"),
    ('{ directory = "../other" }', "", "comes from directory"),
    ('{ editable = "../other" }', "", "comes from editable"),
])
def test_a_lock_that_names_other_sources_is_refused(source, files, why):
    problem = lock_problem("uv.lock", lock(source, files), (PYPI,))
    assert problem.startswith("uv.lock: package 'tinypkg': ") and why in problem


def test_without_an_index_a_lock_may_name_none():
    """UV_NO_INDEX: the operator's builds use find-links alone."""
    assert "named (none)" in lock_problem("uv.lock", lock('{ registry = "https://pypi.org/simple" }', PYPI_WHEEL), ())


def test_a_byte_order_mark_is_no_part_of_the_first_line():
    assert requirements_problem("r.txt", "\ufefftinypkg\n".encode()) == ""
    assert requirements_problem("r.txt", "\ufeff--index-url https://x\n".encode()).startswith("r.txt:1: ")


@pytest.mark.parametrize("entry", [
    '[[package]]\nname = "tinypkg"\n',
    '[[package]]\nname = "tinypkg"\nsource = { subdirectory = "x" }\n',
    '[[distribution]]\nname = "tinypkg"\nsource = { path = "/etc/shadow" }\n',
])
def test_a_lock_entry_without_a_source_of_a_known_kind_is_refused(entry):
    assert lock_problem("uv.lock", entry.encode(), (PYPI,)).startswith("uv.lock: package 'tinypkg': ")
