#!/usr/bin/env bash
# tfcluster on a real NVIDIA GPU: one coordinator and one agent on this machine, started the way the README's
# Quick start starts them (a CA, a join token, mutual TLS), then:
#   1. the agent's NVML discovery: the GPU's UUID and memory in `status --json`, against nvidia-smi's, and its
#      GPU health checks (what NVML could read, no condition on a healthy GPU);
#   2. a job with `gpus = 1` whose task runs under the job's own UID, sees exactly that GPU through
#      CUDA_VISIBLE_DEVICES and multiplies matrices on it (PyTorch: the task's program is any program);
#   3. the agent's /metrics while it runs: the GPU held by that task, its utilisation and memory;
#   4. a second `gpus = 1` job waiting (PENDING, with its reason) while the first holds the GPU, and running
#      once it is free;
#   5. the agent killed (-9) and started again while the first job runs: the task goes on (same PID, the GPU
#      still held, the second job still waiting) and the job succeeds;
#   6. preemption that saves first: a `high` job preempts a `low` one that holds 20 GiB of the GPU; the low job's
#      task saves its step on SIGTERM and exits 42, the high job finds the GPU's memory given back, and the low
#      job resumes from the step it saved;
#   7. `tfcluster doctor` passing on the GPU node, and `tfcluster usage` charging the GPU-time the jobs held.
# Needs root (tasks run under per-job UIDs), nvidia-smi, and a Python with tfcluster's dependencies and PyTorch:
#   PYTHON=/path/to/python3 bench/gpu_proof.sh            (OUT=dir keeps status, metrics and logs there)
# AGENT_ARGS adds flags to the agent's command line; TASK_FILES names a dir copied beside the task's program.
# Prints one line per check (ok / FAILED) and exits non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3)}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SECONDS_OF_WORK=${SECONDS_OF_WORK:-50}
work=$(mktemp -d /var/tmp/tfcluster-gpu.XXXXXX)
chmod 711 "$work"
failed=0
pids=()

say() { printf '%s\n' "$*" | tee -a "$OUT/summary.txt"; }
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
    if [ "$2" = 0 ]; then say "ok      $1: $3"; else say "FAILED  $1: $3"; failed=1; fi
}
tfc() { "$PY" -m tfcluster.cli "$@"; }
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    sleep 2
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

# Tasks run as their job's own user: they must reach this checkout and the Python (o+x on the dirs above).
for path in "$(pwd)" "$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')" ${PYTHONPATH:+${PYTHONPATH//:/ }}; do
    dir=$path
    while [ "$dir" != / ] && [ -n "$dir" ]; do chmod o+x "$dir" 2>/dev/null; dir=$(dirname "$dir"); done
done

say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1); python $("$PY" -V 2>&1)"
nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits >"$OUT/nvidia-smi.csv"
smi_uuid=$(head -n 1 "$OUT/nvidia-smi.csv" | cut -d, -f2 | tr -d ' ')
smi_mib=$(head -n 1 "$OUT/nvidia-smi.csv" | cut -d, -f3 | tr -d ' ')
gpu_count=$(wc -l <"$OUT/nvidia-smi.csv")

# The cluster, as the Quick start makes it.
cat >"$work/policy.toml" <<EOF
[classes]
low = { value = 0, preemptible = true }
high = { value = 10, preemptible = false }
[defaults]
class = "low"
max_class = "high"
EOF
tfc ca init --dir "$work/ca" --san 127.0.0.1 >"$OUT/ca-init.txt" 2>&1
export TFCLUSTER_COORDINATOR=127.0.0.1:17070 TFCLUSTER_TLS_DIR=$work/ca/admin
"$PY" -m tfcluster.cli coordinator --listen 127.0.0.1:17070 --join-listen 127.0.0.1:17071 --tls-dir "$work/ca" \
    --state-dir "$work/coordinator" --http-listen 127.0.0.1:19100 --policy "$work/policy.toml" \
    >"$OUT/coordinator.log" 2>&1 &
coordinator=$!
pids+=($coordinator)
# The token goes to a file only root reads, never on a command line.
for _ in $(seq 60); do
    kill -0 "$coordinator" 2>/dev/null || { say "FAILED  coordinator exited: $(tail -n 3 "$OUT/coordinator.log")"; exit 1; }
    tfc token create --ttl 1h 2>"$OUT/token.err" | install -m 600 /dev/stdin "$work/join-token"
    [ -s "$work/join-token" ] && break
    sleep 0.5
done
[ -s "$work/join-token" ] || { say "FAILED  no join token: $(tail -n 3 "$OUT/token.err")"; exit 1; }
start_agent() {  # the same command line each time: a restarted agent finds its tasks in its state dir
    "$PY" -m tfcluster.cli agent --name gpu-node --coordinator 127.0.0.1:17070 --join-address 127.0.0.1:17071 \
        --join-token-file "$work/join-token" --ca-cert "$work/ca/ca.crt" --advertise-address 127.0.0.1 \
        --port-range 21000-21199 --state-dir "$work/agent" --http-listen 127.0.0.1:19101 --gpu-check-interval 5s \
        ${AGENT_ARGS:-} \
        >>"$OUT/agent.log" 2>&1 &
    agent=$!
    pids+=($agent)
}
start_agent

ready=1
for _ in $(seq 120); do
    tfc status --json >"$OUT/status-ready.json" 2>/dev/null &&
        "$PY" -c 'import json,sys; n=json.load(open(sys.argv[1]))["nodes"]; sys.exit(0 if n and n[0]["state"]=="READY" else 1)' \
            "$OUT/status-ready.json" && { ready=0; break; }
    sleep 0.5
done
check "agent registered" $ready "node gpu-node READY over mutual TLS"
[ $ready = 0 ] || { tail -n 5 "$OUT/agent.log"; exit 1; }

# 1. NVML discovery, as status --json shows it.
"$PY" - "$OUT/status-ready.json" "$smi_uuid" "$smi_mib" "$gpu_count" >"$OUT/discovery.txt" <<'EOF'
import json, sys
status, uuid, mib, count = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
node = status["nodes"][0]
print(json.dumps(node, indent=1))
listed = node["gpus"]
found = [g for g in listed if g["uuid"] == uuid]
assert len(listed) == count, f"status lists {len(listed)} GPUs, nvidia-smi {count}"
assert found, f"no GPU with nvidia-smi's UUID {uuid} in status --json: {listed}"
assert abs(found[0]["memory_mib"] - mib) <= 1, f"{found[0]['memory_mib']} MiB against nvidia-smi's {mib} MiB"
print(f"status --json: {found[0]['name']} {uuid}, {found[0]['memory_mib']} MiB = nvidia-smi's")
EOF
check "NVML discovery" $? "$(tail -n 1 "$OUT/discovery.txt")"

# 1b. The agent's GPU health checks through NVML: what the board let it read, and no condition on a healthy GPU.
first_check=$(grep -o 'GPU health: first check: .*' "$OUT/agent.log" | head -n 1)
"$PY" -c 'import json,sys; n=json.load(open(sys.argv[1]))["nodes"][0]; sys.exit(1 if any(c.get("excludes") for c in n.get("conditions") or []) else 0)' \
    "$OUT/status-ready.json"
healthy=$?
[ -n "$first_check" ] || first_check="no first check in the agent log"
check "GPU health" $([ $healthy = 0 ] && [ "${first_check#GPU health: }" != "$first_check" ]; echo $?) "${first_check#GPU health: }"

# 2. A job with one GPU: its task prints who it is and what it sees, then multiplies matrices on the GPU.
cat >"$work/gpu_task.py" <<EOF
import os, time, torch
print("uid", os.getuid(), "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
print("torch sees", torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name(0),
      "uuid GPU-" + str(torch.cuda.get_device_properties(0).uuid), flush=True)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, products = time.time() + ${SECONDS_OF_WORK}, 0
start = time.time()
while time.time() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
    products += 50
elapsed = time.time() - start
print(f"{products} bf16 8192^3 products in {elapsed:.1f} s: {products * 2 * 8192**3 / elapsed / 1e12:.0f} TFLOP/s", flush=True)
EOF
chmod 644 "$work/gpu_task.py"
[ -n "${TASK_FILES:-}" ] && cp -r "$TASK_FILES"/. "$work"/ && chmod -R a+rX "$work"
job_spec() {  # job_spec NAME
    cat <<EOF
name = "$1"
strategy = "mirrored"
command = ["$PY", "$work/gpu_task.py"]
shared_workdir = true
workdir = "$work"
stop_grace_seconds = 5
[roles.worker]
count = 1
gpus = 1
EOF
}
job_spec gpu-first >"$work/first.toml"
job_spec gpu-second >"$work/second.toml"
first=$(tfc start "$work/first.toml" 2>"$OUT/start-first.err" | head -n 1)
check "first job submitted" $([ -n "$first" ]; echo $?) "${first:-$(cat "$OUT/start-first.err")}"
[ -n "$first" ] || exit 1

job_field() {  # job_field JOB EXPR: a Python expression over `job` in status --json
    tfc status --json 2>/dev/null | "$PY" -c "import json,sys
jobs=[j for j in json.load(sys.stdin)['jobs'] if j['id']=='$1']
job=jobs[0] if jobs else {}
print($2)"
}
wait_ended() {  # wait_ended JOB: until it has SUCCEEDED, FAILED or STOPPED (two minutes at most)
    for _ in $(seq 240); do
        case "$(job_field "$1" "job.get('state')")" in SUCCEEDED|FAILED|STOPPED) return;; esac; sleep 0.5
    done
}
seconds_since() { "$PY" -c "import time; print(f'{time.time() - $1:.1f}')"; }  # seconds_since UNIX-TIME
for _ in $(seq 120); do [ "$(job_field "$first" "job.get('state')")" = RUNNING ] && break; sleep 0.5; done
sleep 8  # the task has started its products: the GPU is busy

# 3. /metrics while it runs.
# HTTPS with the node's certificate; the admin's client certificate may read it, as a scraper's would.
fetch_metrics() {
    "$PY" - "$work/ca/admin" <<'EOF'
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=f"{sys.argv[1]}/ca.crt")
context.load_cert_chain(f"{sys.argv[1]}/client.crt", f"{sys.argv[1]}/client.key")
print(urllib.request.urlopen("https://127.0.0.1:19101/metrics", context=context, timeout=10).read().decode())
EOF
}
fetch_metrics >"$OUT/metrics-running.txt" 2>"$OUT/metrics.err"
grep '^tfcluster_gpu_' "$OUT/metrics-running.txt" >"$OUT/gpu-metrics.txt"
grep -q "tfcluster_gpu_allocated{.*job_id=\"$first\"" "$OUT/gpu-metrics.txt"
check "GPU held on /metrics" $? "$(grep "tfcluster_gpu_allocated{" "$OUT/gpu-metrics.txt" | head -n 1)"
util=$(grep '^tfcluster_gpu_utilization_ratio' "$OUT/gpu-metrics.txt" | head -n 1)
"$PY" -c "import sys; sys.exit(0 if float('${util##* }' or 0) > 0 else 1)" 2>/dev/null
check "GPU busy on /metrics" $? "${util:-no tfcluster_gpu_utilization sample}"

# 4. A second job with one GPU waits while the first holds it.
tfc status --json >"$OUT/status-running.json"
say "info    conditions while busy: $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["nodes"][0].get("conditions"))' "$OUT/status-running.json")"
second=$(tfc start "$work/second.toml" 2>"$OUT/start-second.err" | head -n 1)
sleep 3
tfc status >"$OUT/status-both.txt" 2>&1
state=$(job_field "$second" "job.get('state')")
reason=$(job_field "$second" "job.get('message', '')")
check "second job waits" $([ "$state" = PENDING ]; echo $?) "$second $state: $reason"

# 5. The agent dies and comes back while the first job's task runs on the GPU: the task must not notice.
task_pid() { job_field "$1" "(job.get('tasks') or [{}])[0].get('pid')"; }
pid_before=$(task_pid "$first")
kill -KILL "$agent"
wait "$agent" 2>/dev/null
kill -0 "$pid_before" 2>/dev/null
check "task outlives its agent" $? "pid $pid_before still running after kill -9 of the agent"
registrations=$(grep -c 'registered with' "$OUT/agent.log")
restarted_at=$(date +%s.%N)
start_agent
for _ in $(seq 300); do  # the new agent has registered (the node never went LOST: it was gone under 15 s)
    [ "$(grep -c 'registered with' "$OUT/agent.log")" -gt "$registrations" ] && break
    sleep 0.1
done
back_in=$(seconds_since "$restarted_at")
pid_after=$(task_pid "$first")
state_after=$(job_field "$first" "job.get('state')")
second_after=$(job_field "$second" "job.get('state')")
check "agent restart costs no job" \
    $([ "$pid_after" = "$pid_before" ] && [ "$state_after" = RUNNING ] && [ "$second_after" = PENDING ]; echo $?) \
    "registered again ${back_in} s after the new agent started; $first $state_after, pid $pid_after; $second $second_after"
fetch_metrics >"$OUT/metrics-restarted.txt" 2>>"$OUT/metrics.err"
grep -q "^tfcluster_gpu_allocated{.*job_id=\"$first\"" "$OUT/metrics-restarted.txt"
check "GPU held after the restart" $? "$(grep '^tfcluster_gpu_allocated{' "$OUT/metrics-restarted.txt" | head -n 1)"

wait_ended "$first"
tfc logs "$first" worker:0 >"$OUT/first-task.log" 2>&1
first_state=$(job_field "$first" "job.get('state')")
check "first job" $([ "$first_state" = SUCCEEDED ]; echo $?) "$first_state; $(tr '\n' ';' <"$OUT/first-task.log")"
task_uid=$(awk '/^uid/ {print $2}' "$OUT/first-task.log")
visible=$(awk '/^uid/ {print $4}' "$OUT/first-task.log")
check "task's own UID" $([ -n "$task_uid" ] && [ "$task_uid" != 0 ]; echo $?) "uid ${task_uid:-?} (not root)"
sees=$(grep -c "torch sees 1 GPU(s):.*uuid $smi_uuid" "$OUT/first-task.log")
check "exactly that GPU" $([ "$sees" = 1 ]; echo $?) "CUDA_VISIBLE_DEVICES=$visible; $(grep 'torch sees' "$OUT/first-task.log")"

wait_ended "$second"
tfc logs "$second" worker:0 >"$OUT/second-task.log" 2>&1
second_state=$(job_field "$second" "job.get('state')")
check "second job after the first" $([ "$second_state" = SUCCEEDED ]; echo $?) \
    "$second_state; $(grep -h TFLOP "$OUT/second-task.log")"

# 6. Preemption that saves first, on the GPU: a `low` job holds the GPU (20 GiB of its memory) and trains; a `high`
# job arrives. The low job's task gets SIGTERM, saves its step and exits 42; the high job starts on the freed GPU
# and finds its memory given back; the low job then resumes from the step it saved.
cat >"$work/gpu_saver.py" <<EOF
import os, signal, sys, time, torch
checkpoint = os.path.join(os.environ["TFCLUSTER_CHECKPOINT_DIR"], "step.pt")
step = torch.load(checkpoint)["step"] if os.path.exists(checkpoint) else 0
print("resumed from step", step, flush=True) if step else None
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.time()))
hold = torch.empty(20 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("holding", hold.numel() >> 30, "GiB", flush=True)
while step < ${SAVER_STEPS:-400}:
    for _ in range(50):
        c = a @ a
    torch.cuda.synchronize()
    step += 1
    if stopping:
        torch.save({"step": step}, checkpoint)
        print(f"tfcluster: preemption checkpoint saved at step {step}, {time.time() - stopping[0]:.2f} s after SIGTERM", flush=True)
        sys.exit(42)
print("done at step", step, flush=True)
EOF
cat >"$work/gpu_urgent.py" <<EOF
import time, torch
free, total = torch.cuda.mem_get_info()
print(f"free {free / 2**30:.1f} of {total / 2**30:.1f} GiB", flush=True)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 10
while time.time() < end:
    c = a @ a
torch.cuda.synchronize()
EOF
chmod 644 "$work/gpu_saver.py" "$work/gpu_urgent.py"
spec_for() {  # spec_for NAME PROGRAM PRIORITY
    job_spec "$1" | sed "s|$work/gpu_task.py|$work/$2|; s|^stop_grace_seconds = .*|stop_grace_seconds = 30\npriority = \"$3\"|"
}
spec_for gpu-saver gpu_saver.py low >"$work/saver.toml"
spec_for gpu-urgent gpu_urgent.py high >"$work/urgent.toml"
saver=$(tfc start "$work/saver.toml" 2>"$OUT/start-saver.err" | head -n 1)
for _ in $(seq 240); do tfc logs "$saver" worker:0 2>/dev/null | grep -q holding && break; sleep 0.5; done
sleep 5
submitted=$(date +%s.%N)
urgent=$(tfc start "$work/urgent.toml" 2>"$OUT/start-urgent.err" | head -n 1)
for _ in $(seq 600); do [ "$(job_field "$urgent" "job.get('state')")" = RUNNING ] && break; sleep 0.1; done
took=$(seconds_since "$submitted")
saver_message=$(job_field "$saver" "job.get('message', '')")
tfc logs "$saver" worker:0 --attempt 1 >"$OUT/saver-1.log" 2>&1
saved=$(grep -o 'saved at step [0-9]*' "$OUT/saver-1.log" | grep -o '[0-9]*$')
check "preemption saves first" $([ -n "$saved" ] && [ "$(job_field "$urgent" "job.get('state')")" = RUNNING ]; echo $?) \
    "$urgent RUNNING ${took} s after its submission; $(grep 'saved at' "$OUT/saver-1.log"); $saver: $saver_message"
wait_ended "$urgent"
tfc logs "$urgent" worker:0 >"$OUT/urgent.log" 2>&1
free_gib=$(grep -o 'free [0-9.]*' "$OUT/urgent.log" | grep -o '[0-9.]*$')
"$PY" -c "import sys; sys.exit(0 if float('${free_gib:-0}') > 70 else 1)"
check "GPU memory given back" $? "$(cat "$OUT/urgent.log") (the preempted task held 20 GiB)"
wait_ended "$saver"
tfc logs "$saver" worker:0 >"$OUT/saver-2.log" 2>&1
saver_state=$(job_field "$saver" "job.get('state')")
preemptions=$(job_field "$saver" "job.get('preemptions')")
restarts=$(job_field "$saver" "job.get('restarts')")
check "preempted job resumes" \
    $([ "$saver_state" = SUCCEEDED ] && [ "$restarts" = 0 ] && grep -q "resumed from step $saved\$" "$OUT/saver-2.log"; echo $?) \
    "$saver $saver_state, preemptions $preemptions, restarts charged $restarts; $(tr '\n' ';' <"$OUT/saver-2.log")"

# 7. The operator's checks on a GPU node.
tfc doctor >"$OUT/doctor.txt" 2>&1
check "doctor" $? "$(grep -c . "$OUT/doctor.txt") checks printed; $(tail -n 1 "$OUT/doctor.txt")"
tfc usage --since 1h --json >"$OUT/usage.json" 2>&1
"$PY" - "$OUT/usage.json" >"$OUT/usage.txt" 2>&1 <<'EOF'
import json, sys
users = json.load(open(sys.argv[1]))["users"]
gpu_seconds = sum(u["gpu_seconds"] for u in users)
assert gpu_seconds > 0, f"no GPU-time charged: {users}"
print(f"{gpu_seconds:.0f} GPU-seconds charged to {', '.join(u['name'] for u in users)}")
EOF
check "usage" $? "$(tail -n 1 "$OUT/usage.txt")"
tfc status --json >"$OUT/status-end.json" 2>&1
say "artifacts: $OUT"
exit $failed
