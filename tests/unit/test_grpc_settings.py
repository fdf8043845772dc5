"""tfcluster's processes fork while other threads serve and call gRPC (the agent starts shims, readers and
installs as the coordinator talks to it). With gRPC's fork handlers on, grpcio's default, such forks ran the
handlers half-way, a child died before its exec and calls of the parent's never completed; the settings
tfcluster makes before importing gRPC turn the handlers off, and are not handed on to tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

FORKS = 300

# Serves the health check, calls it from four threads without pause, and meanwhile forks children that exec
# /bin/true (switching to its own uid, as the agent's readers switch to a task's: no vfork then, so every fork
# is one the handlers see). Prints what came of the children and the calls.
BUSY_FORKS = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    if sys.argv[1] == "tfcluster":
        from tfcluster import grpc_settings
        grpc_settings.apply()
    from concurrent import futures
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(8))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop, failed_calls = threading.Event(), []

    def call():
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        while not stop.is_set():
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            except grpc.RpcError as e:
                failed_calls.append(e.code().name)

    callers = [threading.Thread(target=call, daemon=True) for _ in range(4)]
    for caller in callers:
        caller.start()
    failed_children = []
    for _ in range(int(sys.argv[2])):
        done = subprocess.run(["/bin/true"], capture_output=True, user=os.getuid(), env={})
        if done.returncode or done.stderr:
            failed_children.append([done.returncode, done.stderr.decode(errors="replace")[-300:]])
    stop.set()
    for caller in callers:
        caller.join(15)
    print(json.dumps({"failed_children": failed_children, "failed_calls": failed_calls,
                      "callers_left": sum(caller.is_alive() for caller in callers)}), flush=True)
    os._exit(0)  # a wedged gRPC must not hold the exit
""")


def busy_forks(settings: str) -> subprocess.CompletedProcess:
    """BUSY_FORKS run with gRPC's info logs and nothing of ours set; its stdout says what it saw."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["GRPC_VERBOSITY"] = "INFO"  # set by the user: apply() leaves it
    return subprocess.run([sys.executable, "-c", BUSY_FORKS, settings, str(FORKS)], capture_output=True, text=True,
                          env=env, timeout=180)


def test_forks_while_other_threads_call_grpc_leave_children_and_calls_whole():
    done = busy_forks("tfcluster")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"failed_children": [], "failed_calls": [], "callers_left": 0}
    assert "fork_posix" not in done.stderr, "gRPC's fork handlers ran: " + done.stderr[-1000:]


def test_without_the_settings_grpc_runs_its_fork_handlers_around_the_forks():
    """The reason for the setting: if this fails, grpcio no longer runs its fork handlers by default (then
    grpc_settings.py may drop GRPC_ENABLE_FORK_SUPPORT). The program may not live to say what it saw: in one
    run it died of a segmentation fault just after gRPC's first such line, in another its calls wedged and it
    never ended. So its stderr is read as it comes, and the first such line settles it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["GRPC_VERBOSITY"] = "INFO"
    program = subprocess.Popen([sys.executable, "-c", BUSY_FORKS, "grpc defaults", str(FORKS)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen: list[str] = []
    timer = threading.Timer(180, program.kill)  # a wedged program ends its stderr when killed
    timer.start()
    try:
        for line in program.stderr:
            seen.append(line)
            if "fork_posix" in line:
                break
    finally:
        timer.cancel()
        program.kill()
        program.wait()
        program.stderr.close()
    assert any("fork_posix" in line for line in seen), (program.returncode, "".join(seen)[-1000:])


def test_the_settings_leave_the_users_own_and_are_not_handed_on():
    script = textwrap.dedent("""
        import json, os
        from tfcluster import grpc_settings
        grpc_settings.apply()
        print(json.dumps({"environ": {k: v for k, v in os.environ.items() if k.startswith("GRPC_")},
                          "handed_on": grpc_settings.without_ours(dict(os.environ, GRPC_TRACE="api"))}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env["GRPC_VERBOSITY"] = "DEBUG"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    seen = json.loads(done.stdout)
    assert seen["environ"] == {"GRPC_VERBOSITY": "DEBUG", "GRPC_ENABLE_FORK_SUPPORT": "0"}
    handed_on = {k: v for k, v in seen["handed_on"].items() if k.startswith("GRPC_")}
    assert handed_on == {"GRPC_VERBOSITY": "DEBUG", "GRPC_TRACE": "api"}
