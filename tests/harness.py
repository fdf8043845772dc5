"""A local cluster for tests: a real coordinator and real agents as separate processes on loopback.

Every process is started in its own process group and killed by process group at teardown; tasks the
agents started (each in its own group, under a shim) are found from the agents' state dirs and killed
too. `job_processes` finds any process still carrying a job's TFCLUSTER_JOB_ID.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tfcluster import grpc_settings
from tfcluster.demo.etcd import free_port  # noqa: F401  (the tests' ports: never one handed out twice)

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


_BLOCKS = 90  # of 100 ports each, in 20000-28999
# `make test` runs the suite in several processes (pytest-xdist): each takes every n-th block, so no two give
# agents the same ports.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_WORKERS = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
_next_block = [random.randrange(_BLOCKS // _WORKERS)]


def port_block(size: int = 100) -> int:
    """A base port for an agent's range: successive calls never share a block (agents on one address
    must not), starting at a random one so that two runs rarely meet."""
    assert size <= 100
    block = (_next_block[0] * _WORKERS + _WORKER) % _BLOCKS
    _next_block[0] += 1
    return 20000 + 100 * block


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def old_style_shim(attempt_dir: Path, seconds: int) -> subprocess.Popen:
    """A process that is an attempt's shim as far as anyone can tell from outside: the command line a shim of 0.7
    or before was started with. Returned once the kernel shows that command line: it sets it late in the exec,
    after Popen may have returned, and read at once it was empty now and then (31 of 1,500 tries)."""
    shim = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})",
                             "tfcluster.daemon.agent.taskrunner", str(attempt_dir)], start_new_session=True)
    wait_until(lambda: str(attempt_dir) in psutil.Process(shim.pid).cmdline(), 10, what="the shim's command line")
    return shim


def job_processes(job_id: str) -> list[psutil.Process]:
    """Live processes whose environment carries this job's id (the task and anything it started)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("TFCLUSTER_JOB_ID") == job_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


# Every daemon started, in order: a failed test shows the end of the logs of those it started (conftest.py).
STARTED: list["Daemon"] = []
LOG_TAIL_LINES = 40


def log_tails(started_since: int) -> list[tuple[str, str]]:
    """(daemon, the last lines of its log) for each daemon started since STARTED had that many, and each earlier
    one still running (a cluster shared by several tests)."""
    shown: dict[Path, Daemon] = {}
    for n, daemon in enumerate(STARTED):
        if n >= started_since or daemon.alive:
            shown[daemon.log_path] = daemon
    return [(f"{daemon.name} ({path})", "\n".join(daemon.log().splitlines()[-LOG_TAIL_LINES:]))
            for path, daemon in shown.items()]


@dataclass
class Daemon:
    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    host_prefix: list[str] = field(default_factory=list)  # runs it on a test host (ip netns exec ...)
    python: str = PYTHON  # another interpreter runs another tfcluster (an earlier release)

    def start(self, env: dict[str, str] | None = None) -> "Daemon":
        log = open(self.log_path, "ab")
        argv = [*self.host_prefix, self.python, "-m", "tfcluster.cli", *self.args]
        # Not in the source tree: `python -m` puts the working directory first on the path, and a daemon of an
        # earlier release (another interpreter) must import its own tfcluster.
        # The tests' own gRPC settings are not passed on: the daemon makes its own, as under systemd.
        environment = {**{k: v for k, v in os.environ.items() if k not in grpc_settings.SETTINGS}, **(env or {})}
        if self.python != PYTHON:  # nor from PYTHONPATH, which would put this version's tree first
            environment.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, cwd=self.log_path.parent,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=environment)
        log.close()
        STARTED.append(self)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the daemon's whole process group (tasks live in their own groups)."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 10) -> None:
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class LocalCluster:
    root: Path
    lost_after: float = 3.0
    # The tests of what follows a node's loss want its tasks lost with it, as they were before the task grace (its
    # default, 20 s, is tested where the agent restarts): a second more than --lost-after.
    tasks_lost_after: float = 1.0
    coordinator: Daemon | None = None
    agents: dict[str, Daemon] = field(default_factory=dict)
    address: str = ""
    port_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    coordinator_host: str = "127.0.0.1"
    tls: bool = True  # mutual TLS with a CA made in root/ca; False: every daemon runs with --insecure
    token_file: Path | None = None  # with tls=False: the shared token, given to every daemon and CLI call
    host_prefixes: dict[str, list[str]] = field(default_factory=dict)  # agent name -> test host prefix
    join_address: str = ""
    join_token: str = ""  # reusable, for every agent of the cluster

    @property
    def ca_dir(self) -> Path:
        return self.root / "ca"

    @property
    def admin_dir(self) -> Path:
        """The CLI's credentials (TFCLUSTER_TLS_DIR)."""
        return self.ca_dir / "admin"

    def start_coordinator(self, *extra: str, python: str = PYTHON) -> Daemon:
        if not self.address:
            self.address = f"{self.coordinator_host}:{free_port(self.coordinator_host)}"
            self.join_address = f"{self.coordinator_host}:{free_port(self.coordinator_host)}"
        if self.tls and not self.ca_dir.exists():
            from tfcluster import pki
            pki.init_ca(self.ca_dir, [self.coordinator_host])
        trust = ["--tls-dir", str(self.ca_dir), "--join-listen", self.join_address] if self.tls else \
            ["--insecure", *self._token_args()]
        self.coordinator = Daemon("coordinator", ["coordinator", "--listen", self.address, "--state-dir",
                                                  str(self.root / "coordinator"), "--lost-after", str(self.lost_after),
                                                  *(trust if python == PYTHON else self._token_args()),
                                                  *(["--tasks-lost-after", str(self.tasks_lost_after)]
                                                    if python == PYTHON else []), *extra],
                                  self.root / "coordinator.log", python=python).start()
        wait_until(lambda: self._reachable(), 30, what=f"the coordinator on {self.address}")
        if self.tls and not self.join_token:
            self.join_token = self.cli("token", "create", "--reusable", "--ttl", "1d", check=True).stdout.strip()
        return self.coordinator

    def _reachable(self) -> bool:
        if not self.coordinator.alive:
            raise AssertionError(f"coordinator exited:\n{self.coordinator.log()}")
        with socket.socket() as s:
            return s.connect_ex((self.coordinator_host, int(self.address.rsplit(":", 1)[1]))) == 0

    def agent_state_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def task_output(self, job_id: str, task: str, attempt: int = 1) -> str:
        """The first bytes a task attempt wrote, read from its attempt dir on whichever agent ran it: what
        `tfcluster logs` shows, without a CLI process per look (a test that waits for a line of a job that trains
        on must see it at once, also on a loaded machine)."""
        from tfcluster import layout
        kind, index = task.split(":")
        for name in self.agents:
            attempt_dir = layout.attempt_dir(self.agent_state_dir(name), job_id, kind, int(index), attempt)
            with contextlib.suppress(FileNotFoundError):
                return (attempt_dir / layout.OUTPUT_FILE).read_text(errors="replace")
        return ""

    def start_agent(self, name: str, gpus: int = 0, ports: tuple[int, int] | None = None,
                    extra: list[str] | None = None, wait: bool = True, host_prefix: list[str] | None = None,
                    python: str = PYTHON, driver: str = "") -> Daemon:
        """An agent on loopback, or (host_prefix) on a test host, where it finds its own address. Its GPUs are
        declared (with that NVIDIA driver version, when given)."""
        state = self.agent_state_dir(name)
        state.mkdir(parents=True, exist_ok=True)
        inventory = state.parent / f"{name}-gpus.json"
        declared = [{"index": i, "uuid": f"GPU-{name}-{i}", "name": "Test GPU", "memory_mib": 16384}
                    for i in range(gpus)]
        inventory.write_text(json.dumps({"driver": driver, "cuda": "13.0", "gpus": declared} if driver else declared))
        base = port_block()
        # A restarted agent keeps its node's port range, as a systemd unit with the same env file would.
        first, last = ports or self.port_ranges.get(name) or (base, base + 99)
        self.port_ranges[name] = (first, last)
        if host_prefix is not None:
            self.host_prefixes[name] = host_prefix
        prefix = self.host_prefixes.get(name, [])
        address = [] if prefix else ["--advertise-address", "127.0.0.1"]
        args = ["agent", "--coordinator", self.address, "--name", name, *address,
                "--port-range", f"{first}-{last}", "--state-dir", str(state), "--gpu-inventory", str(inventory),
                *(self.agent_trust_args() if python == PYTHON else self._token_args()), *(extra or [])]
        # `python3` in a job's command is the agent's own virtualenv's, first on its tasks' PATH (tasks/start.py).
        daemon = self.agents[name] = Daemon(name, args, self.root / f"agent-{name}.log",
                                            host_prefix=prefix, python=python).start()
        if wait:
            wait_until(lambda: self.node_state(name) == "READY", 30, what=f"agent {name} to register")
        return daemon

    def start_agents(self, agents: dict[str, dict]) -> None:
        """Starts agents together (name -> start_agent's keyword arguments) and waits until all are READY."""
        for name, options in agents.items():
            self.start_agent(name, wait=False, **options)
        wait_until(lambda: all(self.node_state(name) == "READY" for name in agents), 60,
                   what=f"agents {', '.join(agents)} to register")

    def _token_args(self) -> list[str]:
        return ["--token-file", str(self.token_file)] if self.token_file else []

    def agent_trust_args(self) -> list[str]:
        """How an agent of this release joins: with the cluster's token and CA (a restart reuses its certificate)."""
        if not self.tls:
            return ["--insecure", *self._token_args()]
        return ["--join-token-file", str(self.join_token_file()), "--ca-cert", str(self.ca_dir / "ca.crt"),
                "--join-address", self.join_address]

    def join_token_file(self, token: str = "") -> Path:
        """A file holding a join token (the cluster's reusable one by default), as an agent reads it."""
        token = token or self.join_token
        path = self.root / "tokens" / f"{token.partition('.')[0]}.token"
        path.parent.mkdir(exist_ok=True)
        path.write_text(token + "\n")
        path.chmod(0o600)
        return path

    def client_env(self) -> dict[str, str]:
        """What a CLI call needs in its environment to reach this cluster as its admin."""
        trust = {"TFCLUSTER_TLS_DIR": str(self.admin_dir)} if self.tls else \
            {"TFCLUSTER_TOKEN_FILE": str(self.token_file)} if self.token_file else {}
        return {"TFCLUSTER_COORDINATOR": self.address, **trust}

    def cli(self, *args: str, timeout: float = 120, check: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run([PYTHON, "-m", "tfcluster.cli", *args], capture_output=True, text=True,
                                timeout=timeout, env={**os.environ, **self.client_env(), **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"tfcluster {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def status(self, job_id: str | None = None) -> dict:
        from tfcluster.views import status_doc
        with self.client() as client:
            response = client.status(job_id or "")
            return status_doc(response.nodes, response.jobs, response.summary)

    def person(self, name: str, role: str = "user") -> Path:
        """A CLI credentials dir (TFCLUSTER_TLS_DIR) of someone of this cluster, issued by `tfcluster ca issue`
        the first time."""
        out = self.root / "people" / name
        if not out.exists():
            self.cli("ca", "issue", "--dir", str(self.ca_dir), "--role", role, "--name", name, "--out", str(out),
                     check=True)
        return out

    def credentials(self, role: str = "admin", name: str = "admin", valid_hours: float = 1.0):
        """Credentials of this cluster's CA for anyone: the admin's by default, else made now (with
        valid_hours < 0, expired). With tls=False: none, and the token if there is one."""
        import datetime

        from tfcluster import pki
        from tfcluster.auth import load_token
        from tfcluster.security import Credentials
        if not self.tls:
            return Credentials(token=load_token(self.token_file))
        if (role, name, valid_hours) == ("admin", "admin", 1.0):
            return Credentials.from_dir(self.admin_dir)
        ca = pki.Authority.load(self.ca_dir, with_key=True)
        key = pki.new_key()
        if valid_hours > 0:
            cert = ca.sign(key.public_key(), name, role, datetime.timedelta(hours=valid_hours), [name, "127.0.0.1"])
        else:  # the CA never signs one that is already expired: build it here
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes
            from cryptography.x509.oid import NameOID
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (x509.CertificateBuilder()
                    .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                             x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]))
                    .issuer_name(ca.cert.subject).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(hours=2))
                    .not_valid_after(now + datetime.timedelta(hours=valid_hours))
                    .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                    .sign(ca.key, hashes.SHA256()))
        return Credentials(ca.pem, pki.cert_pem(cert), pki.key_pem(key))

    def channel(self, role: str = "admin", name: str = "admin", address: str = ""):
        """A gRPC channel to the coordinator (or address) with credentials(role, name)."""
        return self.credentials(role, name).channel(address or self.address)

    def client(self):
        """A client of the coordinator with the admin's credentials."""
        from tfcluster.client import Client
        return Client(self.address, self.credentials())

    def job(self, job_id: str) -> dict:
        return self.status(job_id)["jobs"][0]

    def node_state(self, name: str) -> str | None:
        try:
            nodes = {n["name"]: n for n in self.status()["nodes"]}
        except Exception:
            return None
        return nodes.get(name, {}).get("state")

    def wait_job(self, job_id: str, states=("SUCCEEDED", "FAILED", "STOPPED"), timeout: float = 60) -> dict:
        return wait_until(lambda: (lambda j: j if j["state"] in states else None)(self.job(job_id)), timeout,
                          what=f"{job_id} to reach {'/'.join(states)}")

    def lose_node(self, name: str) -> None:
        """The node is lost as a machine is: its agent killed -9, and the tasks it ran with it."""
        self.agents[name].kill()
        for group in self.task_groups(name):
            kill_group(group)

    def task_groups(self, agent: str = "*") -> list[int]:
        """Process groups of every task (and shim) the agents (or that one) ever started."""
        groups = []
        for status in self.root.glob(f"agents/{agent}/jobs/*/tasks/*/attempt-*/status.json"):
            try:
                data = json.loads(status.read_text())
            except (OSError, ValueError):
                continue
            groups += [data.get("pgid"), data.get("shim_pid")]
        return [g for g in groups if g]

    def teardown(self) -> None:
        for daemon in [*self.agents.values(), self.coordinator]:
            if daemon is not None:
                daemon.kill()
        for group in self.task_groups():
            kill_group(group)
        unmount_under(self.root)


def unmount_under(root: Path) -> None:
    """Detaches what agents killed here left mounted under root (tasks' working dirs over cached code): an agent
    unmounts them when a task ends or when it starts again, neither of which happens after a kill -9."""
    prefix = str(Path(root).resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        targets = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for target in reversed(targets):
        subprocess.run(["umount", "-l", target], capture_output=True)


def finish(cluster: LocalCluster, job_id: str, timeout: float = 360) -> dict:
    """The job once it has ended, which must be SUCCEEDED, with none of its processes left."""
    job = cluster.wait_job(job_id, timeout=timeout)
    assert job["state"] == "SUCCEEDED", f"{job['state']}: {job['message']}\n{job.get('last_failure')}"
    wait_until(lambda: job_processes(job_id) == [], 10, what="no process of the job left")
    return job


def final_checkpoint(job: dict) -> tuple[str, int]:
    """The (checkpoint name, step) of the job's latest evaluation: how far its training went."""
    latest = job["evaluation"]["latest"]
    assert latest is not None, "the evaluator reported nothing"
    return Path(latest["checkpoint"]).name, latest["step"]


@contextlib.contextmanager
def running_cluster(root: Path, agents: dict[str, dict], **options):
    """A started coordinator and agents (see LocalCluster.start_agents), torn down afterwards."""
    cluster = LocalCluster(root=root, **options)
    try:
        cluster.start_coordinator()
        cluster.start_agents(agents)
        yield cluster
    finally:
        cluster.teardown()


def hand_on(directory: Path) -> None:
    """Lets the next job write what an ended one left in directory, as an operator does between two jobs that
    share a checkpoint dir: each job runs as a UID of its own, and files are made writable by their owner only."""
    for path in [directory, *directory.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o777 if path.is_dir() else 0o666))


def scrape(url: str, credentials: dict | None) -> dict[str, list]:
    """A /metrics page parsed with prometheus-client's parser, {family: [(labels, value)]}, fetched with the
    certificate in credentials ({"ca", "cert", "key"} file paths), or with none at all."""
    context = ssl.create_default_context(cafile=credentials["ca"] if credentials else None)
    if credentials and credentials.get("cert"):
        context.load_cert_chain(credentials["cert"], credentials["key"])
    if not credentials:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(text)}


def value(metrics: dict, family: str, **labels) -> float | None:
    """The first sample of a scraped family whose labels include these."""
    for sample_labels, sample_value in metrics.get(family, []):
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            return sample_value
    return None


def digits_spec(path: Path, name: str, strategy: str = "mirrored", workers: int = 1, gpus: int = 1,
                epochs: int = 3, evaluator: bool = True) -> Path:
    """A spec file for the demo's tf-keras digits classifier, its checkpoints in path's dir; returns the file."""
    spec = path / f"{name}.toml"
    evaluator_table = '[roles.evaluator]\nentrypoint = "tfcluster.demo.digits:evaluation"\n' if evaluator else ""
    spec.write_text(f"""name = "{name}"
strategy = "{strategy}"
command = ["{sys.executable}", "-m", "tfcluster.demo.train_digits"]
checkpoint_dir = "{path / (name + '-ckpt')}"
env = {{ EPOCHS = "{epochs}" }}
[roles.worker]
count = {workers}
gpus = {gpus}
{evaluator_table}""")
    return spec
