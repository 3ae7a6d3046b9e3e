#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Relay and end-to-end benchmarks on the embedded mock broker and on a real 3-node Kafka
# cluster, in one run on one machine, so the two columns are comparable.
#
#   scripts/kafka-bench.sh [--build DIR] [--rows 300000] [--partitions 64] [--calls 10000]
#                          [--rate 0] [--conns 64] [--consumers 2] [--only mock|real]
#                          [--cluster-dir D] [--no-relay] [--idle 20] [--warmup 300]
#                          [--warm-jit SECONDS] [--up-arg ARG]...
#
# relay: `onceq-bench relay --rows N` (outbox -> broker, idempotent, acks=all; its same-run
#        baseline is raw librdkafka produce of the same payloads to the same broker) against
#        a topic of --partitions partitions (RF 3, min.insync.replicas 2 on real Kafka).
# e2e:   `onceq up` (producer, relay, --consumers consumers; --brokers for the real cluster,
#        whose onceq topics are recreated with 6 partitions, RF 3, as the embedded broker's),
#        --warmup warm-up calls (not measured), then --calls calls of charge/send_email (60/40) over HTTP at
#        --rate calls/s (0: closed loop, as fast as the pipeline answers) on --conns
#        connections. calls/s = calls / (last result applied - first submit committed), and
#        the submit-to-result latency p50/p99, both read from calls.db's timestamps.
# Each block also reports the brokers' CPU seconds and resident memory over the run: on the
# 2-core machine the brokers share the CPU with everything else. The e2e block adds the
# brokers' CPU per call (their user+system time from /proc/PID/stat over the run / calls) and
# their cost at idle: CPU over --idle seconds with no onceq client, then over as long with the
# idle pipeline (after the warm-up has drained), in cores; "added" is the difference. On real
# Kafka it also gives the CPU per call above the no-client idle rate (the cluster's own
# housekeeping over the run's duration is not the calls' cost), how much of the brokers' CPU
# went to the JVMs' JIT compilers (still warming up on a young cluster: a longer --warmup
# leaves less of it in the measured run, as on a long-running cluster; it fades only after
# some 100,000 calls through a cluster, so the block also gives the CPU per call without the
# JIT threads, and above the no-client idle with the JIT left out of both), the brokers' CPU
# by thread kind (request handlers, replica fetchers, JIT ...), and the onceq processes' CPU.
# --warm-jit S (real Kafka only; 0, the default, is off): after --warmup, keep warming in rounds
# of 10,000 calls until the JIT compiler threads took at most 10 % of the brokers' CPU in two
# rounds in a row (one quiet round was seen followed by a busy one), for at most S seconds,
# printing each round's JIT share: the measured run then meets brokers whose JIT has settled,
# as on a cluster that has been running for a while (a fresh 3-node cluster here still spent
# about half of its CPU in the JIT after 100,000 calls).
# Requests: every onceq Kafka client writes librdkafka's statistics once a second
# (ONCEQ_KAFKA_STATS_DIR, common/kafka.c); the e2e block prints the requests per call by type
# (the difference of two snapshots around the measured run, over all onceq clients), then by
# client (process/handle kind: the producer's results consumer, the relay's producer, the
# consumers' consumer and their producers: result relay, DLQ, readiness), the messages per
# Produce request, and the idle pipeline's requests per second.
# `onceq up` picks its clients' kafka-profile itself (mock on the embedded broker, real with
# --brokers); --up-arg passes one more argument to it (e.g. --up-arg -X --up-arg linger.ms=5).
# --no-relay skips the relay blocks; --idle 0 skips the idle measurement.
# The last line, `e2e real/mock`, is the real cluster's calls/s over the embedded broker's.
# The real cluster is started in a temporary folder and stopped by pid at the end, unless
# --cluster-dir names one started with scripts/kafka-cluster.sh (left running).
set -uo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

build=${BUILD_DIR:-$src/build}
rows=300000
partitions=64
calls=10000
rate=0
conns=64
consumers=2
only=
cluster_dir=
relay=1
idle=20
warmup=300
warm_jit=0
up_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --calls) calls=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --consumers) consumers=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --cluster-dir) cluster_dir=$2; shift 2 ;;
    --no-relay) relay=0; shift ;;
    --idle) idle=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --warm-jit) warm_jit=$2; shift 2 ;;
    --up-arg) up_args+=("$2"); shift 2 ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e '/SPDX-License-Identifier/d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[[ "$build" == /* ]] || build=$PWD/$build
export ONCEQ_SRC=$src ONCEQ_BUILD=$build ONCEQ_BIN=$build/onceq
export ONCEQ_LOG_LEVEL=${ONCEQ_LOG_LEVEL:-error}
unset ONCEQ_TEST_BROKERS
. "$src/tests/integration/lib.sh"
[[ -x "$ONCEQ_BIN" ]] || oq_fail "no onceq binary at $ONCEQ_BIN"
BENCH=$build/onceq-bench
[[ -x "$BENCH" ]] || oq_fail "no onceq-bench program at $BENCH"
oq_tmpdir
LOAD=$(oq_tool oq_e2e_load)
TICK=$(getconf CLK_TCK)

cpu_s() { # total user+system CPU seconds of the pids given
    local p t=0 v
    for p in "$@"; do
        v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) || continue
        t=$((t + v))
    done
    awk -v t="$t" -v k="$TICK" 'BEGIN {printf "%.2f", t / k}'
}
jit_s() { # CPU seconds of the JVMs' JIT compiler threads (C1/C2 CompilerThread) of the pids given
    local p t total=0 v
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            [[ $(cat "$t/comm" 2>/dev/null) == C[12]\ CompilerThre* ]] || continue
            v=$(awk '{print $14 + $15}' "$t/stat" 2>/dev/null) || continue
            total=$((total + v))
        done
    done
    awk -v t="$total" -v k="$TICK" 'BEGIN {printf "%.2f", t / k}'
}
threads_cpu() { # threads_cpu PID...: "kind ticks" per thread kind (its name without digits), summed
    local p
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            printf '%s %s\n' "$(tr -d '0-9 ' <"$t/comm" 2>/dev/null)" \
                "$(awk '{print $14 + $15}' "$t/stat" 2>/dev/null)"
        done
    done | awk 'NF == 2 {s[$1] += $2} END {for (k in s) print k, s[k]}'
}
idle_cores() { # idle_cores PID...: the pids' CPU over $idle seconds, in cores, then that of their JIT threads
    local a b ja jb
    a=$(cpu_s "$@")
    ja=$(jit_s "$@")
    sleep "$idle"
    b=$(cpu_s "$@")
    jb=$(jit_s "$@")
    awk -v a="$a" -v b="$b" -v ja="$ja" -v jb="$jb" -v s="$idle" 'BEGIN {printf "%.3f %.3f", (b - a) / s, (jb - ja) / s}'
}
# Warm-up rounds of 10,000 calls on the real cluster until the brokers' JIT threads took at
# most 10 % of their CPU in two rounds in a row, or $warm_jit seconds have passed (uses the
# caller's target, port, d and pids).
warm_until_jit_settles() {
    local round=0 quiet=0 start=$SECONDS c0 c1 j0 j1 cpu share n=10000
    while :; do
        round=$((round + 1))
        c0=$(cpu_s "${pids[@]}")
        j0=$(jit_s "${pids[@]}")
        "$LOAD" --port "$port" --calls "$n" --conns "$conns" --prefix "warm$round-$target" \
            --mix 60,40,0,0,0 >"$T/warm-$target.out" 2>&1 || oq_fail "$target: warm-up load failed"
        oq_wait_for 300 drained "$d/calls.db" "warm$round-$target" "$n" ||
            oq_fail "$target: warm-up round $round not drained"
        c1=$(cpu_s "${pids[@]}")
        j1=$(jit_s "${pids[@]}")
        read -r cpu share < <(awk -v a="$c0" -v b="$c1" -v ja="$j0" -v jb="$j1" \
            'BEGIN {printf "%.1f %.0f", b - a, (b > a) ? (jb - ja) * 100 / (b - a) : 0}')
        echo "warm-up round $round: $n calls, brokers' CPU $cpu s, of which JIT threads $share % ($((SECONDS - start)) s so far)"
        if ((share <= 10)); then quiet=$((quiet + 1)); else quiet=0; fi
        if ((quiet >= 2)); then
            echo "warm-up: the brokers' JIT settled after $round round(s) ($((SECONDS - start)) s)"
            return 0
        fi
        if ((SECONDS - start >= warm_jit)); then
            echo "warm-up: stopped at --warm-jit $warm_jit s with the JIT at $share % of the brokers' CPU"
            return 0
        fi
    done
}
rss_mib() { # resident MiB of each pid given, space-separated
    local p
    for p in "$@"; do ps -o rss= -p "$p" 2>/dev/null | awk '{printf "%.0f ", $1 / 1024}'; done
}

kstats_snap() { # kstats_snap DIR: "client type count" lines, summed over DIR's statistics files
    local f pid kind
    for f in "$1"/*.json; do
        [[ -e "$f" ]] || continue
        pid=${f##*/}
        pid=${pid%%-*}
        kind=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | awk '{print $2}')
        jq -r --arg k "${kind:-gone}" '.type as $t |
            ((.brokers[] | .req | to_entries[] | select(.value > 0) | "\($k)/\($t) \(.key) \(.value)"),
             "\($k)/\($t) _txmsgs \(.txmsgs)", "\($k)/\($t) _rxmsgs \(.rxmsgs)")' "$f" 2>/dev/null
    done | awk '{s[$1 " " $2] += $3} END {for (k in s) print k, s[k]}'
}
kstats_delta() { # kstats_delta BEFORE AFTER: "client type count" over the interval
    awk 'NR == FNR {b[$1 " " $2] = $3; next} {d = $3 - b[$1 " " $2]; if (d > 0) print $1, $2, d}' "$1" "$2"
}
kstats_less_idle() { # kstats_less_idle RUN IDLE IDLE_S MARGIN_S: RUN less IDLE's rates over MARGIN_S
    awk -v s="$3" -v m="$4" 'NR == FNR {r[$1 " " $2] = $3 / s; next}
        {d = $3 - ($2 ~ /^_/ ? 0 : r[$1 " " $2] * m); if (d > 0) print $1, $2, d}' "$2" "$1"
}
kstats_report() { # kstats_report DELTA DIVISOR UNIT: requests by type per UNIT, all clients then by client
    local f=$1 n=$2 unit=$3
    awk -v n="$n" -v u="$unit" '
        $2 !~ /^_/ {t[$2] += $3; c[$1] = c[$1] sprintf(" %s %.3f", $2, $3 / n); tot += $3; ct[$1] += $3}
        $2 == "Produce" {p[$1] = $3}
        $2 == "_txmsgs" {m[$1] = $3}
        END {
            line = ""; for (k in t) line = line sprintf(" %s %.3f,", k, t[k] / n)
            printf "Kafka requests per %s by type:%s total %.3f\n", u, line, tot / n
            for (k in c) printf "  %s (%.3f):%s\n", k, ct[k] / n, c[k]
            line = ""; for (k in p) if (p[k] > 0) line = line sprintf(" %s %.1f,", k, m[k] / p[k])
            if (line != "") printf "  messages per Produce request:%s\n", substr(line, 1, length(line) - 1)
        }' "$f"
}

# --- the real cluster --------------------------------------------------------------------------
REAL=
JAVA_PIDS=()
kcluster() { bash "$src/scripts/kafka-cluster.sh" "$@" --dir "$cluster_dir"; }
if [[ "$only" != mock ]]; then
    if [[ -z "$cluster_dir" ]]; then
        cluster_dir=$T/cluster
        bash "$src/scripts/kafka-fetch.sh" >/dev/null || oq_fail "cannot fetch Kafka"
        kcluster start >/dev/null || oq_fail "cannot start the Kafka cluster"
        oq_on_exit "bash '$src/scripts/kafka-cluster.sh' stop --dir '$cluster_dir'"
    fi
    REAL=$(kcluster bootstrap) || oq_fail "no cluster in $cluster_dir"
    for i in 1 2 3; do
        p=$(kcluster pid "$i" 2>/dev/null)
        [[ -n "$p" ]] && JAVA_PIDS+=("$p")
    done
fi

echo "# onceq on the mock broker vs real Kafka ($(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$src/kafka/pom.xml"), 3 KRaft nodes, RF 3), $(date -u +%FT%TZ)"
echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); relay rows=$rows partitions=$partitions; e2e calls=$calls (after $warmup warm-up calls) rate=$rate conns=$conns consumers=$consumers"

topics_real() { # topics_real PARTITIONS: recreate the onceq topics on the real cluster
    "$ONCEQ_BIN" topics delete --if-exists --brokers "$REAL" onceq.tool-calls onceq.tool-results \
        onceq.dlq >/dev/null &&
        "$ONCEQ_BIN" topics create --brokers "$REAL" --partitions "$1" >/dev/null ||
        oq_fail "could not recreate the topics on the real cluster"
}

# --- relay -------------------------------------------------------------------------------------
bench_relay() { # bench_relay mock|real
    local target=$1 b pids c0 c1
    if [[ $target == mock ]]; then
        oq_start_broker --partitions "$partitions"
        b=$BROKERS
        pids=("$(oq_pid broker)")
    else
        topics_real "$partitions"
        b=$REAL
        pids=("${JAVA_PIDS[@]}")
    fi
    echo
    echo "## relay, $target: onceq-bench relay --rows $rows ($partitions partitions)"
    c0=$(cpu_s "${pids[@]}")
    "$BENCH" relay --brokers "$b" --rows "$rows" --dir "$T" 2>&1 | grep -v '^ts='
    c1=$(cpu_s "${pids[@]}")
    echo "broker CPU during the benchmark: $(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.1f", b - a}') s; RSS MiB: $(rss_mib "${pids[@]}")"
    [[ $target == mock ]] && oq_kill broker
    return 0
}

# --- e2e ---------------------------------------------------------------------------------------
q() { sqlite3 -cmd '.timeout 5000' "$1" "$2"; }

drained() { # drained DB PREFIX N: N calls with that key prefix, none pending or running
    local r
    r=$(q "$1" "SELECT count(*), sum(state IN ('pending','running')) FROM calls WHERE idem_key LIKE '$2-%'" 2>/dev/null)
    [[ "$r" == "$3|0" ]]
}

E2E_RATE=()
bench_e2e() { # bench_e2e mock|real
    local target=$1 d=$T/e2e-$1 port pids=() c0 c1 bargs=() i idle0= idle1= idle0j= r
    mkdir -p "$d"
    port=$(oq_free_port)
    if [[ $target == real ]]; then
        topics_real 6
        bargs=(--brokers "$REAL")
        pids=("${JAVA_PIDS[@]}")
        # no onceq client: the cluster's own idle cost (the embedded broker has none to measure
        # before `onceq up` starts it)
        if ((idle > 0)); then
            read -r idle0 idle0j < <(idle_cores "${pids[@]}")
        fi
    fi
    # `onceq up` chooses the clients' kafka-profile by its brokers; a value left in the
    # environment by oq_start_broker (the relay block) must not reach it
    local ks=$T/kstats-$target
    mkdir -p "$ks"
    oq_spawn "up-$target" env -u ONCEQ_KAFKA_PROFILE ONCEQ_KAFKA_STATS_DIR="$ks" "$ONCEQ_BIN" up --dir "$d" \
        --consumers "$consumers" --listen "127.0.0.1:$port" "${bargs[@]}" "${up_args[@]}"
    oq_wait_for 60 curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$port/healthz" ||
        oq_fail "$target: producer not healthy"
    if [[ $target == mock ]]; then
        for i in $(seq 1 50); do
            pids=($(pgrep -P "$(oq_pid "up-$target")" -f "onceq broker" || true))
            [[ ${#pids[@]} -gt 0 ]] && break
            sleep 0.1
        done
    fi
    "$LOAD" --port "$port" --calls "$warmup" --conns "$((warmup >= 3000 ? conns : 8))" \
        --prefix "warm-$target" --mix 60,40,0,0,0 >"$T/warm-$target.out" 2>&1 ||
        oq_fail "$target: warm-up load failed"
    oq_wait_for 300 drained "$d/calls.db" "warm-$target" "$warmup" ||
        oq_fail "$target: warm-up not drained"
    if ((idle > 0)); then
        sleep 3 # the last offset commits and result marks
        local ki0=$EPOCHREALTIME ki1
        kstats_snap "$ks" >"$T/ks-idle0-$target"
        read -r idle1 _ < <(idle_cores "${pids[@]}")
        sleep 1.2 # the statistics' interval
        kstats_snap "$ks" >"$T/ks-idle1-$target"
        ki1=$EPOCHREALTIME
        kstats_delta "$T/ks-idle0-$target" "$T/ks-idle1-$target" >"$T/ks-idle-$target"
    fi
    # after the idle measurement, right before the run: with the rounds before the idle
    # seconds, each of three runs still had 0.9-1.0 s of JIT in it (a quarter of the brokers'
    # CPU), the one run with them here 0.4 s
    if [[ $target == real ]] && ((warm_jit > 0)); then
        warm_until_jit_settles
    fi

    echo
    echo "## e2e, $target: onceq up --consumers $consumers${bargs[*]:+ --brokers (real)}${up_args[*]:+ ${up_args[*]}}; $calls calls, rate $rate, $conns conns"
    local kids=() k0 k1
    kids=($(pgrep -P "$(oq_pid "up-$target")" -f "onceq (producer|relay|consumer)" || true))
    local ks0=$EPOCHREALTIME ks1
    kstats_snap "$ks" >"$T/ks-0-$target"
    k0=$(cpu_s "${kids[@]}") # after the snapshot: its pause is not the run's
    local t0=$EPOCHREALTIME t1 j0 j1
    j0=$(jit_s "${pids[@]}")
    [[ $target == real ]] && threads_cpu "${pids[@]}" >"$T/thr-0"
    c0=$(cpu_s "${pids[@]}")
    "$LOAD" --port "$port" --calls "$calls" --rate "$rate" --conns "$conns" --prefix "run-$target" \
        --mix 60,40,0,0,0 >"$T/run-$target.out" 2>&1 || oq_fail "$target: load failed: $(cat "$T/run-$target.out")"
    oq_wait_for 300 drained "$d/calls.db" "run-$target" "$calls" || oq_fail "$target: not drained in 300 s"
    c1=$(cpu_s "${pids[@]}")
    t1=$EPOCHREALTIME
    j1=$(jit_s "${pids[@]}")
    [[ $target == real ]] && threads_cpu "${pids[@]}" >"$T/thr-1"
    k1=$(cpu_s "${kids[@]}")
    sleep 1.2 # the statistics' interval: the last requests of the run are in the files
    kstats_snap "$ks" >"$T/ks-1-$target"
    ks1=$EPOCHREALTIME
    grep -E '^(accepted|rate|submit_p99_ms)=' "$T/run-$target.out" | paste -sd' ' - | sed 's/^/submit side: /'
    r=$(q "$d/calls.db" "
        WITH r AS (SELECT created_at AS c, updated_at AS u, updated_at - created_at AS l
                   FROM calls WHERE idem_key LIKE 'run-$target-%'),
             n AS (SELECT count(*) AS n, min(c) AS c0, max(u) AS u1 FROM r)
        SELECT printf('calls/s %.0f over %.2f s; submit->result p50 %d ms, p99 %d ms, max %d ms',
                      n.n * 1000.0 / max(n.u1 - n.c0, 1), (n.u1 - n.c0) / 1000.0,
                      (SELECT l FROM r ORDER BY l LIMIT 1 OFFSET (SELECT n / 2 FROM n)),
                      (SELECT l FROM r ORDER BY l LIMIT 1 OFFSET (SELECT n * 99 / 100 FROM n)),
                      (SELECT max(l) FROM r))
        FROM n;")
    echo "$r"
    E2E_RATE+=("$target=$(awk '{print $2}' <<<"$r")")
    echo "broker CPU during the run: $(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.1f", b - a}') s, $(awk -v a="$c0" -v b="$c1" -v n="$calls" 'BEGIN {printf "%.3f", (b - a) * 1000 / n}') ms per call; RSS MiB: $(rss_mib "${pids[@]}")"
    [[ $target == real ]] && echo "of which the JVMs' JIT compiler threads: $(awk -v a="$j0" -v b="$j1" 'BEGIN {printf "%.1f", b - a}') s (warm-up of the brokers, not a per-call cost)"
    # the cluster's own idle cost (KRaft, group and log housekeeping) over the run is not the
    # calls' cost: what is above it, per call
    [[ -n "$idle0" ]] && echo "broker CPU above the no-client idle: $(awk -v a="$c0" -v b="$c1" -v i="$idle0" -v s="$t0" -v e="$t1" -v n="$calls" 'BEGIN {printf "%.3f", (b - a - i * (e - s)) * 1000 / n}') ms per call (the run took $(awk -v s="$t0" -v e="$t1" 'BEGIN {printf "%.1f", e - s}') s)"
    [[ $target == real ]] && echo "broker CPU without the JIT threads: $(awk -v a="$c0" -v b="$c1" -v ja="$j0" -v jb="$j1" -v n="$calls" 'BEGIN {printf "%.3f", (b - a - (jb - ja)) * 1000 / n}') ms per call${idle0:+; above the no-client idle, JIT left out of both: $(awk -v a="$c0" -v b="$c1" -v ja="$j0" -v jb="$j1" -v i="$idle0" -v ij="$idle0j" -v s="$t0" -v e="$t1" -v n="$calls" 'BEGIN {printf "%.3f", (b - a - (jb - ja) - (i - ij) * (e - s)) * 1000 / n}') ms per call}"
    [[ $target == real ]] && echo "brokers' CPU by thread kind, ms per call: $(awk -v k="$TICK" -v n="$calls" 'NR == FNR {a[$1] = $2; next}
        {d = ($2 - a[$1]) * 1000 / k / n; if (d >= 0.005) printf "%s %.3f\n", $1, d}' "$T/thr-0" "$T/thr-1" | sort -k2 -rn | head -8 | paste -sd, - | sed 's/,/, /g')"
    echo "onceq processes' CPU during the run (producer, relay, consumers): $(awk -v a="$k0" -v b="$k1" -v n="$calls" 'BEGIN {printf "%.1f s, %.3f ms per call", b - a, (b - a) * 1000 / n}')"
    if ((idle > 0)); then
        if [[ -n "$idle0" ]]; then
            echo "broker CPU at idle (${idle} s each): no client $idle0 cores ($idle0j in JIT threads), idle pipeline $idle1 cores, added $(awk -v a="$idle0" -v b="$idle1" 'BEGIN {printf "%.3f", b - a}') cores"
        else
            echo "broker CPU at idle (${idle} s): idle pipeline $idle1 cores"
        fi
    fi
    kstats_delta "$T/ks-0-$target" "$T/ks-1-$target" >"$T/ks-run-$target"
    if ((idle > 0)); then
        # the snapshots span the run and a margin (the pause after it, files up to 1 s old):
        # the idle pipeline's own requests over that margin are not the calls'
        local isec margin
        isec=$(awk -v a="$ki0" -v b="$ki1" 'BEGIN {print b - a}')
        margin=$(awk -v a="$ks0" -v b="$ks1" -v s="$t0" -v e="$t1" 'BEGIN {m = (b - a) - (e - s); print (m > 0 ? m : 0)}')
        kstats_less_idle "$T/ks-run-$target" "$T/ks-idle-$target" "$isec" "$margin" >"$T/ks-net-$target"
        kstats_report "$T/ks-net-$target" "$calls" call
        echo "  (less the idle pipeline's requests over the $(printf %.1f "$margin") s the snapshots add around the run)"
        kstats_report "$T/ks-idle-$target" "$isec" "second at idle" | head -1
    else
        kstats_report "$T/ks-run-$target" "$calls" call
    fi
    oq_kill "up-$target"
    return 0
}

for target in mock real; do
    [[ -n "$only" && "$only" != "$target" || $relay == 0 ]] && continue
    bench_relay "$target"
done
for target in mock real; do
    [[ -n "$only" && "$only" != "$target" ]] && continue
    bench_e2e "$target"
done
if [[ ${#E2E_RATE[@]} == 2 ]]; then
    m=${E2E_RATE[0]#mock=} r=${E2E_RATE[1]#real=}
    echo
    echo "e2e real/mock: $(awk -v m="$m" -v r="$r" 'BEGIN {printf "%.2f", (m > 0 ? r / m : 0)}') ($r / $m calls/s)"
fi
