# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers for the tests of HTTP tools against `onceq downstream` (test_realtools_*.sh and the
# chaos tests of outside calls). Source lib.sh and chaos/pipeline.sh first, then this file.
#
#   rt_start_downstream [ARGS]  spawn `onceq downstream` as "ds" on $DPORT (ledger $DDB)
#   rt_tools FILE [JQ]          write the tools file: examples/tools.json aimed at $DPORT, plus
#                               the variants of RT_VARIANTS (a jq array of tool objects, may use
#                               $base = the example "pay" tool), then JQ applied
#   rt_mode JSON                POST /admin/mode to the downstream
#   rt_submit KEY TOOL ARGS     submit through the producer; prints the call id
#   rt_call KEY                 the producer's call JSON for KEY
#   rt_wait_status KEY STATUS S wait up to S seconds for the call of KEY to reach STATUS
#   rt_eid CALL_ID              the call's effect id (the idempotency key sent)
#   rt_ledger_by FIELD VALUE    "count id" of ledger payments with idempotency_key / reference
#   rt_dstat JQ                 a field of the downstream's /ledger/stats
#   rt_cq SQL                   a query on the consumer database
#   rt_verify [ARGS]            onceq verify --json with the ledger as the third input
#   rt_at_least N CMD...        true when CMD prints a number >= N (for oq_wait_for, which
#                               runs it again each time)

DPORT=$(oq_free_port) || oq_fail "no free port"
DURL=http://127.0.0.1:$DPORT
oq_tmpdir
DDB=$T/ds.db

rt_start_downstream() {
    oq_spawn ds "$ONCEQ_BIN" downstream --listen "127.0.0.1:$DPORT" --db "$DDB" "$@"
    oq_wait_for 15 curl -sf "$DURL/healthz" || oq_fail "downstream did not come up"
}

rt_tools() {
    local out=$1 extra=${2:-.}
    jq --arg u "127.0.0.1:$DPORT" --argjson variants "${RT_VARIANTS:-[]}" '
      .tools |= map(walk(if type == "string" then gsub("127.0.0.1:8090"; $u) else . end))
      | .tools[0] as $base
      | .tools += ($variants | map(if .base then ($base + .) | del(.base) else . end))
      | '"$extra" "$ONCEQ_SRC/examples/tools.json" >"$out" || oq_fail "cannot write $out"
}

rt_mode() { curl -sf -X POST "$DURL/admin/mode" -d "$1" >/dev/null || oq_fail "admin mode $1"; }

rt_submit() {
    local out
    out=$(curl -s -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: $1" \
        -d "{\"tool\":\"$2\",\"args\":$3}") || oq_fail "submit $1"
    jq -r .call_id <<<"$out"
}

rt_call() { curl -s "http://127.0.0.1:$PORT/v1/tool-calls/by-key/$1"; }

rt_wait_status() {
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [[ $(rt_call "$1" | jq -r .status) == "$2" ]] && return 0
        sleep 0.1
    done
    return 1
}

rt_eid() { echo "e_${1#c_}"; }

rt_ledger_by() {
    local n id
    n=$(curl -s -o "$T/lookup.json" -D - "$DURL/v1/payments?$1=$2" | tr -d '\r' |
        awk -F': ' 'tolower($1)=="x-match-count"{print $2}')
    id=$(jq -r '.id // empty' "$T/lookup.json" 2>/dev/null)
    echo "${n:-0} ${id:--}"
}

rt_dstat() { curl -sf "$DURL/ledger/stats" | jq -r "$1"; }

# rt_cq's SQLite dialect on the PostgreSQL store (PL_CDB): table names, group_concat,
# json_extract, aliases for subqueries in FROM, booleans as 1/0
rt__pgsql() {
    sed -zE 's/\b(executions|audit|effects|inbox|dlq)\b/onceq.consumer_\1/g
        s/group_concat\(([^,)]*), *\x27([^\x27]*)\x27\)/string_agg(\1, \x27\2\x27)/g
        s/group_concat\(([^,)]*)\)/string_agg(\1, \x27,\x27)/g
        s/(FROM \(SELECT [^()]*\))/\1 _q/g
        s/json_extract\(([a-z_]+), *\x27\$\.([a-z_]+)\x27\)/(\1::jsonb ->> \x27\2\x27)/g' <<<"$1" | tr -d '\0'
}
rt_cq() {
    if [[ "$CDB" == postgres* ]]; then
        psql -XAtq "$CDB" -c "$(rt__pgsql "$1")" |
            sed -E 's/(^|[ |])(t|true)($|[ |])/\11\3/g; s/(^|[ |])(f|false)($|[ |])/\10\3/g'
    else
        sqlite3 -cmd ".timeout 10000" "$CDB" "$1"
    fi
}

# onceq verify over the three databases (producer, consumer, the downstream's ledger)
rt_verify() { pl_verify --downstream-db "$DDB" "$@"; }

rt_at_least() {
    local v
    v=$("${@:2}")
    [[ -n "$v" ]] && ((v >= $1))
}
