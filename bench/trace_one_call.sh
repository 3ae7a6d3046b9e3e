#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One call taken apart, hop by hop: an agent's single call (POST /v1/tool-calls?wait=30s, the
# HTTP tool `pay` against onceq-downstream, one call in flight, 20 ms apart), with the kernel's
# syscall tracepoints (perf record -a: the fsyncs, the HTTP sends and receives of every process)
# instead of a tracer that stops the processes, which would change the timings it measures.
# Prints the median time between consecutive events of the most common sequence: each fsync's
# start, the request to the downstream, its answer, the client's answer. What lies between two
# events (a Kafka hop, a batch, an fsync's own duration) is named in the row.
#
#   bench/trace_one_call.sh [path/to/onceq] [calls (200)]
#
# Needs perf (Debian linux-perf) and root or kernel.perf_event_paranoid <= -1; skipped with a
# note otherwise. Not part of make bench (docs/SCALING.md, "One call, hop by hop").
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${ONCEQ_BIN:-$ROOT/build/onceq}}
N=${2:-200}
BUILD=$(dirname "$BIN")
DS=${ONCEQ_DOWNSTREAM_BIN:-$BUILD/onceq-downstream}
export ONCEQ_SRC=$ROOT
. "$ROOT/tests/integration/lib.sh"
if ! command -v perf >/dev/null || ! perf record -q -a -e syscalls:sys_enter_fdatasync -o /dev/null -- true >/dev/null 2>&1; then
    echo "skipped: needs perf with system-wide tracepoints (root, or kernel.perf_event_paranoid <= -1)"
    exit 0
fi
. "$ROOT/bench/pay_pipeline.sh"
pay_pipeline_start "$BIN" "$DS"
cat >"$T/client.py" <<'PY'
import http.client, json, sys, time
port, n, pfx = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = http.client.HTTPConnection("127.0.0.1", port)
lat = []
for i in range(n):
    t0 = time.perf_counter()
    c.request("POST", "/v1/tool-calls?wait=30s", json.dumps({"tool": "pay", "args": {"amount": 5}}),
              {"Idempotency-Key": f"{pfx}{i}", "Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    lat.append(time.perf_counter() - t0)
    if r.status != 200 or json.loads(body).get("status") != "succeeded":
        sys.exit(f"call {i}: HTTP {r.status} {body[:200]!r}")
    time.sleep(0.02)
lat.sort()
print(f"client: {n} calls, p50 {lat[n // 2] * 1e3:.2f} ms, p90 {lat[int(n * .9)] * 1e3:.2f} ms")
PY
python3 "$T/client.py" "$PORT" 30 warm >/dev/null || oq_fail "warm-up calls failed"
{
    echo "$(oq_pid ds) downstream"
    for p in $(pgrep -P "$(oq_pid up)"); do
        echo "$p $(tr '\0' ' ' <"/proc/$p/cmdline" | awk '{print $2}')"
    done
} >"$T/roles"
perf record -q -a -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_sendto,syscalls:sys_exit_recvfrom \
    -o "$T/perf.data" -- python3 "$T/client.py" "$PORT" "$N" m 2>/dev/null || oq_fail "the traced calls failed"
perf script -i "$T/perf.data" -F comm,pid,tid,time,event,trace >"$T/perf.txt" 2>/dev/null
oq_kill up
oq_kill ds
python3 - "$T/roles" "$T/perf.txt" <<'PY'
import collections, re, statistics, sys
role = {int(p): r for p, r in (l.split() for l in open(sys.argv[1]))}
ev = []
for l in open(sys.argv[2]):
    m = re.match(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+syscalls:sys_(\w+):\s*(.*)", l)
    if not m:
        continue
    comm, pid, ts, kind, rest = m[1], int(m[2]), float(m[4]), m[5], m[6]
    if kind == "exit_recvfrom":
        r = int(rest, 16)
        if r <= 0 or r >= 2**63:
            continue  # EAGAIN and friends
    who = "client" if comm.startswith("python") else role.get(pid)
    if who is None:
        continue
    ev.append((ts, who, comm, kind))
ev.sort()
calls, cur = [], None
for e in ev:  # a call: from the client's first send after its last receive
    if e[1] == "client" and e[3] == "enter_sendto" and (cur is None or cur[-1][1:] == ("client", e[2], "exit_recvfrom")):
        if cur:
            calls.append(cur)
        cur = [e]
    elif cur is not None:
        if cur[-1][1:] != e[1:]:
            cur.append(e)
if cur:
    calls.append(cur)
seqs = collections.Counter(tuple(x[1:] for x in c) for c in calls)
if not seqs:
    sys.exit("no call traced")
sig, n = seqs.most_common(1)[0]
rows = [c for c in calls if tuple(x[1:] for x in c) == sig]
names = {("producer", "exit_recvfrom"): "the producer has the request",
         ("downstream", "exit_recvfrom"): "the downstream has the request",
         ("client", "exit_recvfrom"): "the client has the answer"}
fs = collections.Counter()
print(f"{n} of {len(calls)} calls took the most common path; medians (ms) over those:")
print("| from the previous event to | ms |")
print("|---|---:|")
for j in range(1, len(sig)):
    who, comm, kind = sig[j]
    if kind == "enter_fdatasync":
        fs[who] += 1
        what = f"{who} ({comm}) starts fsync #{fs[who]}"
    elif kind == "enter_sendto":
        what = f"{who} ({comm}) sends"
    else:
        what = names.get((who, kind), f"{who} ({comm}) receives")
    d = statistics.median((r[j][0] - r[j - 1][0]) * 1e3 for r in rows)
    print(f"| {what} | {d:.3f} |")
print(f"| **the whole call** | **{statistics.median((r[-1][0] - r[0][0]) * 1e3 for r in rows):.3f}** |")
PY
