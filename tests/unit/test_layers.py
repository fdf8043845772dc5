"""The layers the package is cut along hold, read from the code's own imports (every import: at the top, inside a
function, under TYPE_CHECKING), and no import cycle remains anywhere in the package.

The rules are those each package's docstring states: the coordinator's core imports no store, server, HA, gRPC or
asyncio; the agent's shim imports nothing else of the agent; tasks never import the session or hooks; the agent
imports nothing of the coordinator; the CLI talks to a cluster through the Python API (tfcluster.cluster), importing daemon code only in
the commands that run a daemon (or the agent's offline `gc`, or the demo). A failure names the importing module,
its line, and the rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tfcluster"
COORDINATOR = "tfcluster.daemon.coordinator"
AGENT = "tfcluster.daemon.agent"


@dataclass(frozen=True)
class Import:
    source: str   # the importing module
    target: str   # the module imported (a submodule when `from package import submodule`)
    line: int
    top: bool     # at the module's top level (not inside a function)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package but the generated ones (tfcluster/api)."""
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "api"}


def imports(name: str, path: Path, known: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside_functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        top = id(node) not in inside_functions
        if isinstance(node, ast.Import):
            found += [Import(name, alias.name, node.lineno, top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.append(Import(name, child if child in known else base, node.lineno, top))
    return found


def all_imports() -> list[Import]:
    known = modules()
    return [i for name, path in known.items() for i in imports(name, path, set(known))]


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def coordinator(*parts: str) -> tuple[str, ...]:
    return tuple(f"{COORDINATOR}.{p}" for p in parts)


def agent(*parts: str) -> tuple[str, ...]:
    return tuple(f"{AGENT}.{p}" for p in parts)


NO_IO = ("grpc", "asyncio", "aiohttp", "sqlite3", "urllib3", "socket", "threading", "subprocess", "tfcluster.security",
         "tfcluster.client")
CORE_TOP = ("core.cluster", "core.node_events", "core.scheduling_pass", "core.status", "core.sweep_events")
API = ("tfcluster.cluster", "tfcluster.codeship", "tfcluster.statuses", "tfcluster.errors", "tfcluster.client")
# (who, what they may not import, why): each rule as the package docstrings state it.
RULES = [
    (coordinator("core"), coordinator("store", "rpc", "ha", "web", "grpc_server", "process") + NO_IO,
     "the core is pure: no store, server, HA, gRPC, asyncio, sockets or threads"),
    (coordinator("core.model"), coordinator("core.lifecycle", "core.scheduling", "core.access", *CORE_TOP),
     "the model imports nothing of the core's other parts"),
    (coordinator("core.lifecycle"), coordinator("core.scheduling", "core.access", *CORE_TOP),
     "the lifecycle imports the model alone"),
    (coordinator("core.scheduling"), coordinator("core.lifecycle", "core.access", *CORE_TOP),
     "scheduling imports the model alone"),
    (coordinator("core.access"), coordinator("core.lifecycle", "core.scheduling", *CORE_TOP),
     "access imports the model alone"),
    (coordinator("store"), coordinator("rpc", "ha", "web", "grpc_server", "process"),
     "the store imports the core alone"),
    (coordinator("rpc"), coordinator("ha", "web", "grpc_server", "process"), "rpc imports the core and the store"),
    (coordinator("web"), coordinator("ha", "grpc_server", "process"), "web imports the core, the store and rpc"),
    ((AGENT,), (COORDINATOR,), "the agent imports nothing of the coordinator"),
    (agent("shim"), agent("tasks", "code", "hooks", "peers", "session", "node", "agent", "main", "taskrunner",
                          "launcher"),
     "the shim imports nothing else of the agent"),
    (agent("tasks"), agent("session", "hooks", "peers", "node", "agent", "main"),
     "tasks never import the session, hooks, peers or the node's services"),
    (agent("code"), agent("session", "hooks", "peers", "node", "agent", "main", "tasks.supervisor", "tasks.start",
                          "tasks.record", "tasks.launcher", "tasks.launcher_process", "tasks.handback"),
     "code imports the shim and tasks' users alone"),
    (agent("hooks"), agent("session", "peers", "node", "agent", "main"), "hooks never import the session"),
    (agent("peers"), agent("session", "hooks", "node", "agent", "main"), "the peer port never imports the session"),
    (agent("session"), agent("tasks", "hooks", "code", "peers", "node", "agent", "main"),
     "the session imports no task code"),
    (("tfcluster.client",), ("tfcluster.daemon", "tfcluster.demo"), "the client imports no daemon code"),
    (API, ("tfcluster.daemon", "tfcluster.demo", "tfcluster.cli"), "the Python API imports no daemon or CLI code"),
    (("tfcluster.cli",), ("tfcluster.client",), "the CLI talks to a cluster through the Python API (Cluster)"),
]
# The CLI talks to a cluster through the Python API; only these commands run daemon code (inside the command).
CLI_RUNS_DAEMONS = ("tfcluster.cli.coordinator", "tfcluster.cli.agent", "tfcluster.cli.daemon_flags", "tfcluster.cli.node",
                    "tfcluster.cli.misc")


def test_every_layer_imports_only_what_its_rule_allows():
    broken = []
    for i in all_imports():
        for who, forbidden, why in RULES:
            if under(i.source, *who) and under(i.target, *forbidden):
                broken.append(f"{i.source} (line {i.line}) imports {i.target}: {why}")
        if under(i.source, "tfcluster.cli") and under(i.target, "tfcluster.daemon", "tfcluster.demo") and \
                (i.top or i.source not in CLI_RUNS_DAEMONS):
            broken.append(f"{i.source} (line {i.line}) imports {i.target}: the CLI imports no daemon code, but in "
                          f"the commands that run one")
    assert broken == [], "\n".join(broken)


def test_no_import_cycle_anywhere_in_the_package():
    graph: dict[str, set[str]] = {}
    known = set(modules())
    for i in all_imports():
        if i.target in known and i.target != i.source:
            graph.setdefault(i.source, set()).add(i.target)
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_each_daemon_package_says_what_it_holds_and_may_import():
    silent = []
    for init in (PACKAGE / "daemon").rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent != PACKAGE / "daemon" and ("import" not in doc or len(doc) < 60):
            silent.append(str(init.relative_to(ROOT)))
    assert silent == [], f"a package's docstring says what it holds and what it may import: {silent}"


def test_no_module_is_left_loose_beside_the_parts():
    loose = {f"{COORDINATOR}.{m}" for m in ("grpc_server", "process")} | \
        {f"{AGENT}.{m}" for m in ("agent", "main", "taskrunner", "launcher")}
    for daemon in (COORDINATOR, AGENT):
        directory = ROOT / daemon.replace(".", "/")
        found = {f"{daemon}.{p.stem}" for p in directory.glob("*.py") if p.name != "__init__.py"}
        assert found <= loose, f"modules beside {daemon}'s parts that are not its entry points: {found - loose}"


def test_the_rules_see_real_imports():
    found = {(i.source, i.target) for i in all_imports()}
    assert (f"{AGENT}.tasks.supervisor", f"{AGENT}.shim.runner") in found
    assert (f"{COORDINATOR}.core.cluster", f"{COORDINATOR}.core.lifecycle.transitions") in found


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(graph):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found
