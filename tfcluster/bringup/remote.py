"""What `tfcluster up` runs on each host, as root: sent over SSH to the host's own python3 (standard library
only, nothing of tfcluster imported: the host may have none installed yet), with a JSON request after it on
stdin. It answers one JSON object on stdout: a probe's facts, or each applied step's outcome.

Services run under systemd when systemd is the host's init (units enabled and started with systemctl);
otherwise, as in a container, the unit's own ExecStart runs as a background daemon in a session of its own, with
the unit's environment file, its pid in /run/tfcluster/NAME.pid and its output in /var/log/tfcluster/NAME.log.
Nothing restarts such a daemon when it dies: `tfcluster up` says so.
"""

import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PID_DIR = "/run/tfcluster"
LOG_DIR = "/var/log/tfcluster"
STATE_DIR = "/var/lib/tfcluster"
SOFTWARE_MARK = ".tfcluster-software"   # in the virtualenv: the id of the software installed there
STOP_SECONDS = 15


class StepFailed(Exception):
    pass


def has_systemd():
    return os.path.isdir("/run/systemd/system")


def sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def probe(request):
    prefix = request["prefix"]
    return {"hostname": socket.gethostname(),
            "python": "%d.%d" % sys.version_info[:2],
            "machine": os.uname().machine,
            "systemd": has_systemd(),
            "software": read_text(os.path.join(prefix, SOFTWARE_MARK)),
            "files": {path: sha256(path) for path in request["files"]},
            "running": {name: running(name) for name in request["services"]},
            "joined": os.path.exists(request["node_cert"]),
            "programs": {path: os.access(path, os.X_OK) for path in request.get("programs", [])},
            "dirs": {path: os.path.isdir(path) for path in request["dirs"]},
            "exists": {path: os.path.exists(path) for path in request.get("exists", [])},
            "env": {path: env_values(path) for path in request.get("env_files", [])},
            "etcd_members": etcd_members(request.get("etcd_members"))}


def etcd_members(request):
    """The members of the etcd cluster this host's member belongs to, as that member lists them ({"members":
    [...]}, {"error": ...} when it does not answer, None when the host has no member's data)."""
    if not request or not os.path.isdir(request["data_dir"]):
        return None
    try:
        return {"members": etcd_call(request, "/v3/cluster/member/list", {}, 3).get("members", [])}
    except (OSError, ValueError, StepFailed) as e:
        return {"error": str(e)}


def etcd_call(step, path, body, timeout):
    """POST body to path on the member's client URL (etcd's JSON gateway), with the member's certificate."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(step["client_url"] + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=etcd_tls(step)) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:  # etcd's own reason is in the body ({"error": ..., "message": ...})
        said = e.read().decode(errors="replace")
        try:
            said = json.loads(said).get("message") or said
        except ValueError:
            pass
        raise StepFailed("etcd at %s: %s: %s" % (step["client_url"], path, said.strip()[:500])) from None


def etcd_tls(step):
    """TLS as the member's own client: etcd's CA, the member's certificate."""
    import ssl

    context = ssl.create_default_context(cafile=step["ca"])
    context.load_cert_chain(step["cert"], step["key"])
    return context


# A membership change waits this long for etcd to answer at all: right after the member that led died (the reason
# to remove it), the others elect a new leader first, and a change asked meanwhile times out or is refused.
MEMBER_CHANGE_SECONDS = 60
# What etcd says while it has no leader; anything else it refuses (a change that would cost the quorum) is final.
ELECTION_WORDS = ("leader changed", "no leader", "request timed out", "too many requests")
# What etcd says when the change was made already, by an earlier try whose answer was lost.
DONE_WORDS = {"/v3/cluster/member/remove": "member not found", "/v3/cluster/member/add": "peer urls already exists"}


def etcd_member(step, clock=time.monotonic, sleep=time.sleep):
    """A change of etcd's membership made through this host's member (it needs the quorum: etcd refuses one
    that would leave too few members started), tried again while etcd elects a leader or does not answer."""
    deadline, tried = clock() + MEMBER_CHANGE_SECONDS, False
    while True:
        try:
            etcd_call(step, step["path"], step["body"], 10)
            return
        except (OSError, StepFailed) as e:  # a timeout is an OSError
            said, done = str(e).lower(), DONE_WORDS.get(step["path"])
            if tried and done and done in said:
                return
            electing = isinstance(e, OSError) or any(words in said for words in ELECTION_WORDS)
            if not electing or clock() >= deadline:
                raise
            tried = True
        sleep(1)


def env_values(path):
    """NAME=value lines of an environment file `up` wrote, by name ({} when there is none)."""
    values = {}
    for line in (read_text(path) or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.startswith("#"):
            values[name.strip()] = value
    return values


def daemon_pid(name):
    """The pid of the background daemon started for unit name, while it runs."""
    try:
        pid = int(read_text(os.path.join(PID_DIR, name + ".pid")) or "")
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return pid if b"tfcluster" in f.read() else None
    except (ValueError, OSError):
        return None


def running(name):
    if has_systemd():
        return subprocess.run(["systemctl", "is-active", "--quiet", name]).returncode == 0
    return daemon_pid(name) is not None


def write_file(step):
    path, mode, data = step["path"], int(step["mode"], 8), base64.b64decode(step["data"])
    if path.endswith(".service"):
        verify_unit(os.path.basename(path), data)
    os.makedirs(os.path.dirname(path), mode=0o755 if mode & 0o044 else 0o700, exist_ok=True)
    tmp = "%s.tmp%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def verify_unit(name, data):
    """`systemd-analyze verify` on the unit, where the host has it; what it says about the unit is a failure (it
    exits 0 on a setting it ignores)."""
    if not shutil.which("systemd-analyze"):
        return
    directory = tempfile.mkdtemp(prefix="tfcluster-unit-")
    try:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
        check = subprocess.run(["systemd-analyze", "verify", "--man=no", os.path.join(directory, name)],
                               capture_output=True, text=True)
    finally:
        shutil.rmtree(directory)
    said = [line for line in (check.stdout + check.stderr).splitlines() if name in line]
    if check.returncode or said:
        raise StepFailed("systemd-analyze verify: " + "; ".join(said or ["exit %d" % check.returncode]))


def install(step):
    prefix, python = step["prefix"], os.path.join(step["prefix"], "bin", "python")
    if not os.path.exists(python):
        command(["python3", "-m", "venv", prefix], "the host's python3 cannot make a virtualenv "
                                                   "(Debian: apt-get install python3-venv)")
    source = (["--no-index", "--find-links", step["wheelhouse"]] if step.get("wheelhouse")
              else ["--index-url", step["index_url"]])
    command([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--upgrade", *source,
             step["requirement"]], "pip could not install %s" % step["requirement"])
    with open(os.path.join(prefix, SOFTWARE_MARK), "w") as f:
        f.write(step["software"] + "\n")
    if step.get("wheelhouse"):
        shutil.rmtree(step["wheelhouse"], ignore_errors=True)


def command(argv, what):
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    if result.returncode:
        raise StepFailed("%s: %s" % (what, (result.stderr or result.stdout).strip()[-800:]))
    return result.stdout


def exec_start(unit_path):
    """The unit's ExecStart as an argv: its lines joined as systemd joins them, and $$ read as $."""
    with open(unit_path) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):].replace("$$", "$"))
    raise StepFailed("%s has no ExecStart" % unit_path)


def environment(path):
    """An EnvironmentFile's variables (NAME=value lines, a value maybe in double quotes)."""
    env = {}
    for line in (read_text(path) or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            env[name.strip()] = value
    return env


def start(step):
    name = step["service"]
    if has_systemd():
        command(["systemctl", "daemon-reload"], "systemctl daemon-reload")
        command(["systemctl", "enable", name], "systemctl enable %s" % name)
        command(["systemctl", "restart", name], "systemctl restart %s (see journalctl -u %s)" % (name, name))
        return
    stop(name)
    for directory, mode in ((STATE_DIR, 0o711), (PID_DIR, 0o755), (LOG_DIR, 0o750)):
        os.makedirs(directory, mode=mode, exist_ok=True)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           **environment(step["env_file"])}
    log = os.open(os.path.join(LOG_DIR, name + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    process = subprocess.Popen(exec_start(step["unit"]), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                               cwd="/", start_new_session=True)
    os.close(log)
    with open(os.path.join(PID_DIR, name + ".pid"), "w") as f:
        f.write("%d\n" % process.pid)
    time.sleep(0.5)
    if process.poll() is not None:
        raise StepFailed("%s exited at once with status %s; its log: %s" % (name, process.returncode,
                                                                            os.path.join(LOG_DIR, name + ".log")))


def stop(name):
    if has_systemd():
        subprocess.run(["systemctl", "disable", "--now", name], capture_output=True)
        return
    pid = daemon_pid(name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        while daemon_pid(name) == pid and time.monotonic() < deadline:
            time.sleep(0.1)
        if daemon_pid(name) == pid:
            os.killpg(pid, signal.SIGKILL)
    try:
        os.unlink(os.path.join(PID_DIR, name + ".pid"))
    except FileNotFoundError:
        pass


def wait_etcd(step):
    """Until the etcd member says its cluster has a leader and commits: the members of a new cluster start on
    their hosts in parallel, and the coordinator started next needs the quorum."""
    import urllib.request

    context = etcd_tls(step)
    deadline, said = time.monotonic() + step["seconds"], "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(step["url"], timeout=2, context=context) as response:
                said = response.read().decode(errors="replace").strip()
            if json.loads(said).get("health") == "true":
                return
        except (OSError, ValueError) as e:
            said = str(e)
        time.sleep(0.5)
    raise StepFailed("etcd at %s not healthy after %d s (%s): are the other coordinator hosts' members up? See "
                     "journalctl -u tfcluster-etcd, or %s/tfcluster-etcd.service.log" % (step["url"], step["seconds"],
                                                                                         said, LOG_DIR))


def remove(step):
    for path in step["paths"]:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


ACTIONS = {"write": write_file, "install": install, "start": start, "stop": lambda step: stop(step["service"]),
           "remove": remove, "wait_etcd": wait_etcd, "etcd_member": etcd_member,
           "run": lambda step: command(step["argv"], step["what"])}


def apply(request):
    done = []
    for step in request["steps"]:
        try:
            ACTIONS[step["kind"]](step)
        except (StepFailed, OSError) as e:
            return {"done": done, "failed": step["name"], "error": str(e)}
        except Exception as e:  # a bug here must still say which step on which host, not end the whole run
            return {"done": done, "failed": step["name"], "error": "%s: %s" % (type(e).__name__, e)}
        done.append(step["name"])
    return {"done": done}


def main():
    request = json.loads(sys.stdin.buffer.read())
    answer = probe(request) if request["op"] == "probe" else apply(request)
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
