#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Many hosts on PostgreSQL and a real 3-node Kafka: one producer and one relay on PostgreSQL,
# three consumer processes as three hosts (each in a working folder of its own, its own tools
# file and TMPDIR; nothing shared but the PostgreSQL database and the Kafka cluster), and an
# `onceq-downstream` service for the HTTP tool `pay` (it keeps its own ledger).
#   - 3,000 calls (1,000 `pay` over HTTP, 2,000 built-in `charge`), every one submitted twice
#     (the second submit must return the same call);
#   - mid-run, one consumer host is killed with -9 and a fourth host is added;
#   - after the drain every message of onceq.tool-calls is produced once more (duplicate
#     delivery), and every copy must reach an inbox;
#   - then `onceq verify` (both stages read from PostgreSQL, the downstream's ledger attached)
#     is clean: 3,000 calls, one effect per call, nothing lost, the ledger's DSR 0 with 1,000
#     payments for 1,000 `pay` calls.
# Negative control, same hosts, afterwards: `liar`, a tool falsely declared idempotent at a
# downstream ignoring keys, with half of its replies dropped after commit: the ledger must
# show duplicates and verify must fail (exit 3) on them, or the checker would be blind here.
# ONCEQ_TEST_MOCK=1 runs it on the embedded broker (development only; the claim is real Kafka).
# ctest-cost: 240
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
[[ "${ONCEQ_TEST_MOCK:-0}" == 1 ]] || . "$ONCEQ_SRC/tests/realkafka/lib.sh"
oq_require_pg
oq_tmpdir
N=${ONCEQ_HOSTS_CALLS:-3000}
URL=$(oq_pg_fresh_db onceq_rk_hosts)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }
oq_start_broker
PDB=$URL
CDB=$URL
PORT=$(oq_free_port)
export PDB CDB PORT

DPORT=$(oq_free_port)
oq_spawn ds "$ONCEQ_DOWNSTREAM_BIN" --listen "127.0.0.1:$DPORT" --db "$T/ds.db" --seed 18
oq_wait_for 15 curl -fsS -o /dev/null "http://127.0.0.1:$DPORT/healthz" || oq_fail "downstream not up"
# the tools file: examples/tools.json aimed at our downstream, plus `liar` (the control)
python3 - "$ONCEQ_SRC/examples/tools.json" "$DPORT" >"$T/tools.json" <<'PY'
import json, sys
doc = json.loads(open(sys.argv[1]).read().replace("127.0.0.1:8090", "127.0.0.1:" + sys.argv[2]))
liar = dict(doc["tools"][0], name="liar", headers={"X-Downstream-Keys": "ignore"})
liar.pop("lookup", None)
doc["tools"].append(liar)
print(json.dumps(doc, indent=1))
PY

pl_spawn_producer
pl_spawn_relay
host() { # host I: a consumer in a working folder of its own, with its own copy of the tools
    local i=$1 d=$T/host-$1
    mkdir -p "$d/tmp"
    cp "$T/tools.json" "$d/tools.json"
    oq_spawn "host-$i" env -C "$d" TMPDIR="$d/tmp" "$ONCEQ_BIN" consumer --db "$CDB" \
        --group onceq-hosts --brokers "$BROKERS" --worker-id "host-$i" --lease 5s \
        --tools tools.json --recover-every 200ms --max-attempts 30 --retry-base 50ms \
        --retry-max 1s --lookup-attempts 100 -X session.timeout.ms=6000
}
for i in 1 2 3; do host "$i"; done
pl_wait_healthy 30

submit_all() { # PASS: every call once more, 8 clients, same key and body each time
    python3 - "$PORT" "$N" "$T/accepted.$1" <<'PY'
import http.client, json, sys, threading, time
port, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ids, lock, todo, bad = {}, threading.Lock(), list(range(n)), []
def body(i):
    if i % 3 == 0:
        return {"tool": "pay", "args": {"amount": 100 + i}}
    return {"tool": "charge", "args": {"amount": 100 + i}}
def worker():
    while True:
        with lock:
            if not todo:
                return
            i = todo.pop()
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("POST", "/v1/tool-calls", json.dumps(body(i)),
                          {"Idempotency-Key": f"mh-{i}", "Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                c.close()
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)
                continue
            if r.status in (200, 202):
                with lock:
                    ids[i] = json.loads(data)["call_id"]
                break
            if r.status >= 500 or r.status == 429:
                time.sleep(0.2)
                continue
            with lock:
                bad.append((i, r.status))
            break
        else:
            with lock:
                bad.append((i, "gave up"))
ts = [threading.Thread(target=worker) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
with open(out, "w") as f:
    for i in sorted(ids):
        f.write(f"{i} {ids[i]}\n")
print(f"accepted={len(ids)} bad={len(bad)} {bad[:5]}")
sys.exit(1 if bad or len(ids) != n else 0)
PY
}

t0=$SECONDS
submit_all 1 >"$T/submit1.out" 2>&1 &
S1=$!
oq_wait_for 120 bash -c "[[ \$(psql -XAtq '$URL' -c \"SELECT count(*) FROM onceq.calls WHERE state = 'succeeded'\") -ge $((N / 6)) ]]" ||
    oq_fail "no progress: $(q 'SELECT state, count(*) FROM onceq.calls GROUP BY state')"
oq_log "kill -9 host-2 at $(q "SELECT count(*) FROM onceq.calls WHERE state = 'succeeded'") succeeded"
oq_kill host-2 KILL
host 4
oq_log "host-4 added"
wait "$S1" || oq_fail "first submit pass: $(cat "$T/submit1.out")"
cat "$T/submit1.out"
submit_all 2 >"$T/submit2.out" 2>&1 || oq_fail "second submit pass: $(cat "$T/submit2.out")"
cat "$T/submit2.out"
cmp -s "$T/accepted.1" "$T/accepted.2" || oq_fail "a second submit returned another call: $(diff "$T/accepted.1" "$T/accepted.2" | head -5)"
awk '{print $2}' "$T/accepted.1" >"$T/accepted"
pl_wait_drained 300 "$N" || oq_fail "not drained: $(q 'SELECT state, count(*) FROM onceq.calls GROUP BY state')"
oq_log "$N calls submitted twice and drained in $((SECONDS - t0)) s"
oq_wait_for 60 grep -q "assigned [1-9][0-9]* partition" "$T/host-4.log" || oq_fail "the added host never got partitions"
oq_log "effects per host: $(q "SELECT string_agg(worker || '=' || n, ' ') FROM (SELECT worker, count(*) n FROM onceq.consumer_effects GROUP BY worker ORDER BY worker) x")"

J0=$(pl_verify --allow-pending --examples 0)
R0=$(pl_field "$J0" inbox_duplicates)
"$(oq_tool oq_e2e_dup)" --brokers "$BROKERS" --topic onceq.tool-calls --times 1 >"$T/dup.out" ||
    oq_fail "re-producing onceq.tool-calls: $(cat "$T/dup.out")"
READ=$(sed -n 's/^read=\([0-9]*\).*/\1/p' "$T/dup.out")
((READ >= N)) || oq_fail "read back only $READ call messages (want >= $N)"
absorbed() { (($(pl_field "$(pl_verify --allow-pending --examples 0)" inbox_duplicates) >= R0 + READ)); }
oq_wait_for 180 absorbed || oq_fail "not all $READ re-produced messages reached an inbox"
pl_wait_drained 60 "$N" || oq_fail "not drained after the duplicates"

J=$("$ONCEQ_BIN" verify --producer-db "$PDB" --consumer-db "$CDB" --downstream-db "$T/ds.db" \
    --accepted "$T/accepted" --json --examples 5)
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" clean) == true && $(pl_field "$J" calls) == "$N" ]] || oq_fail "verify: not clean or not $N calls"
[[ $(pl_field "$J" duplicates) == 0 && $(pl_field "$J" lost) == 0 ]] || oq_fail "duplicate effects or lost calls"
[[ "$(q 'SELECT count(*), count(DISTINCT call_id) FROM onceq.consumer_effects')" == "$N|$N" ]] ||
    oq_fail "effects: $(q 'SELECT count(*), count(DISTINCT call_id) FROM onceq.consumer_effects')"
DS=$(jq -c .downstream <<<"$J")
[[ $(jq -r '.duplicates, .dsr' <<<"$DS" | tr '\n' ' ') == "0 0 " ]] || oq_fail "downstream ledger: $DS"
[[ $(jq -r .effects <<<"$DS") == $(((N + 2) / 3)) ]] || oq_fail "ledger: $DS, want $(((N + 2) / 3)) payments"
oq_log "verify clean: $N calls, one effect each, ledger $DS, $(pl_field "$J" inbox_duplicates) redeliveries absorbed"

# negative control: protection off (a false idempotent declaration at a key-ignoring service)
NC=20
curl -fsS -o /dev/null -X POST "http://127.0.0.1:$DPORT/admin/mode" -H 'Content-Type: application/json' \
    -d '{"faults":"drop-after-commit:0.5"}' || oq_fail "downstream faults"
for i in $(seq 1 $NC); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST "http://127.0.0.1:$PORT/v1/tool-calls" \
        -H "Idempotency-Key: liar-$i" -H 'Content-Type: application/json' -d '{"tool":"liar","args":{"amount":7}}')
    [[ $code == 202 ]] || oq_fail "liar-$i: HTTP $code"
done
pl_wait_drained 180 $((N + NC)) || oq_fail "control calls not drained"
curl -fsS -o /dev/null -X POST "http://127.0.0.1:$DPORT/admin/mode" -H 'Content-Type: application/json' -d '{"faults":""}'
JN=$("$ONCEQ_BIN" verify --producer-db "$PDB" --consumer-db "$CDB" --downstream-db "$T/ds.db" --json --examples 3)
rcn=$?
echo "$JN"
((rcn == 3)) || oq_fail "negative control: verify exit $rcn, want 3 (duplicates in the ledger)"
DUPS=$(jq -r '.by_kind.downstream_dup' <<<"$JN")
((DUPS > 0)) || oq_fail "negative control: no duplicate in the ledger: the checker would be blind"
oq_pass "many hosts on PostgreSQL + Kafka: $N calls x2, host killed and added, every message redelivered: verify clean, one effect per call, ledger DSR 0; control: $DUPS duplicates seen"
