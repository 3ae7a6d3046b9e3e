# SPDX-License-Identifier: Apache-2.0
# Sourced by the benchmarks that call the HTTP tool `pay` through a whole pipeline
# (bench/dbos_baseline.sh, bench/trace_one_call.sh), after tests/integration/lib.sh:
#   pay_pipeline_start BIN DS   starts onceq-downstream (DS) and `onceq up` (BIN) with the
#                               first tool of examples/tools.json (`pay`) pointed at it; sets
#                               DPORT and PORT; returns when every consumer has its partitions
pay_pipeline_start() {
    local bin=$1 ds=$2 n a
    oq_tmpdir
    DPORT=$(oq_free_port) && PORT=$(oq_free_port) || oq_fail "no free port"
    oq_spawn ds "$ds" --listen "127.0.0.1:$DPORT" --db "$T/downstream.db"
    oq_wait_for 15 curl -sf -o /dev/null "http://127.0.0.1:$DPORT/healthz" || oq_fail "downstream did not start"
    jq --arg u "127.0.0.1:$DPORT" '.tools |= [.[0] | walk(if type == "string" then gsub("127.0.0.1:8090"; $u) else . end)]' \
        "$ONCEQ_SRC/examples/tools.json" >"$T/tools.json" || oq_fail "tools file"
    oq_spawn up "$bin" up --dir "$T/up" --listen "127.0.0.1:$PORT" --tools "$T/tools.json"
    oq_wait_for 30 curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" || oq_fail "onceq up did not get ready"
    # Ready is not settled: the embedded broker makes a consumer that joins a group wait
    # session.timeout.ms - 1 s, and the rebalance it then causes would stall the calls of the
    # measured run. Wait (up to 30 s) until every consumer has been assigned its partitions.
    for _ in $(seq 300); do
        n=$(ls "$T"/up/consumer-*.log 2>/dev/null | wc -l)
        a=$(grep -l 'msg="assigned' "$T"/up/consumer-*.log 2>/dev/null | wc -l)
        [[ $n -gt 0 && $a -ge $n ]] && break
        sleep 0.1
    done
}
