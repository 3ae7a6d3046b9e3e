# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Shared helpers for onceq integration and chaos scripts.
#
# Source it first thing:   . "$ONCEQ_SRC/tests/integration/lib.sh"
#
# Sourcing installs an EXIT/INT/TERM trap (oq_cleanup) that kills every process started with
# oq_spawn, by pid (TERM, then KILL after 5 s; then KILL to the process group that oq_spawn
# gave it with setsid, for leftover grandchildren), and removes the temp dir $T unless
# ONCEQ_KEEP_TMP=1. Scripts must not install their own EXIT trap; to add cleanup work, append
# a command with oq_on_exit "cmd ...".
#
# Environment (CTest sets these; defaults suit a manual run from the source tree):
#   ONCEQ_BIN       path of the onceq binary
#   ONCEQ_DOWNSTREAM_BIN  path of onceq-downstream, the test payment service (default: next to
#                   ONCEQ_BIN)
#   ONCEQ_BUILD     build dir (tools such as oq_kclient live there)
#   ONCEQ_SRC       source dir
#   ONCEQ_TESTDATA  tests/data
#   ONCEQ_KEEP_TMP  1 keeps $T after exit (its path is printed)
#   ONCEQ_TEST_BROKERS  a Kafka bootstrap list, or a file holding one: run against that (real)
#                   cluster instead of spawning `onceq broker` (see oq_start_broker)
#   ONCEQ_KAFKA_DIR the cluster's folder when it was started by scripts/kafka-cluster.sh
#                   (lets a test kill or pause a node: oq_kafka_cluster)
#   ONCEQ_TEST_RF, ONCEQ_TEST_MIN_ISR  replication factor (3) and min.insync.replicas (2) of
#                   the topics created on that cluster
#
# Stable functions (other scripts depend on these names):
#   oq_tmpdir                  create $T (idempotent; oq_spawn calls it when needed)
#   oq_spawn NAME CMD...       start CMD in the background, stdout+stderr to $T/NAME.log
#   oq_pid NAME                print the pid of a spawned process
#   oq_alive NAME              true while the process runs
#   oq_kill NAME [SIG]         signal it (default TERM; TERM/INT wait up to OQ_KILL_GRACE s (15),
#                              then KILL; the test goes on either way)
#   oq_wait_exit NAME TIMEOUT  wait for it to exit on its own; returns its exit code (124 on timeout)
#   oq_cleanup                 the trap handler (callable by hand)
#   oq_on_exit CMD             run CMD (eval'd) during cleanup, before processes are killed
#   oq_wait_for TIMEOUT_S CMD...  poll CMD every 0.1 s until it succeeds; 1 on timeout
#   oq_start_broker [ARGS]     spawn `onceq broker` (name "broker"), wait for its bootstrap
#                              file and control FIFO; exports BROKERS and BROKER_CTL. With
#                              ONCEQ_TEST_BROKERS set: use that cluster, (re)create the topics
#                              instead (BROKER_CTL is then empty)
#   oq_broker_ctl "COMMAND"    send one fault command to the broker and wait for its ack;
#                              prints the ack line; 0 if it starts with "ok" (mock only)
#   oq_real_kafka              true when the tests run against ONCEQ_TEST_BROKERS
#   oq_require_real_kafka      for real-Kafka-only scripts: exit 77 (skipped) without a
#                              cluster, or fail under CI=true
#   oq_kafka_cluster CMD...    scripts/kafka-cluster.sh CMD ... --dir $ONCEQ_KAFKA_DIR
#   oq_free_port               print an unused loopback TCP port
#   oq_tool NAME               print the path of a test tool (e.g. oq_kclient) in the build dir
#   oq_log MSG                 progress line on stderr
#   oq_fail MSG                print FAIL + the tail of every spawned log, exit 1
#   oq_pass MSG                print PASS

: "${ONCEQ_SRC:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
: "${ONCEQ_BUILD:=$ONCEQ_SRC/build}"
: "${ONCEQ_BIN:=$ONCEQ_BUILD/onceq}"
: "${ONCEQ_DOWNSTREAM_BIN:=$(dirname "$ONCEQ_BIN")/onceq-downstream}"
: "${ONCEQ_TESTDATA:=$ONCEQ_SRC/tests/data}"
export ONCEQ_SRC ONCEQ_BUILD ONCEQ_BIN ONCEQ_DOWNSTREAM_BIN ONCEQ_TESTDATA

declare -gA OQ_PIDS=()        # name -> pid
declare -ga OQ_PID_ORDER=()   # names in spawn order
declare -ga OQ_EXIT_HOOKS=()
OQ_CLEANED=0
OQ_T_START=$SECONDS

oq_log() { echo "[$(date +%T) +$((SECONDS - OQ_T_START))s] $*" >&2; }

oq_tmpdir() {
    if [[ -z "${T:-}" || ! -d "${T:-}" ]]; then
        T=$(mktemp -d "${TMPDIR:-/tmp}/onceq-test.XXXXXX") || { echo "mktemp failed" >&2; exit 1; }
        export T
    fi
    return 0
}

oq_on_exit() { OQ_EXIT_HOOKS+=("$*"); }

oq_pid() { echo "${OQ_PIDS[$1]:-}"; }

oq_alive() {
    local pid=${OQ_PIDS[$1]:-}
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

oq_spawn() {
    local name=$1
    shift
    oq_tmpdir
    if [[ -n "${OQ_PIDS[$name]:-}" ]] && kill -0 "${OQ_PIDS[$name]}" 2>/dev/null; then
        oq_fail "oq_spawn: '$name' is already running (pid ${OQ_PIDS[$name]})"
    fi
    # setsid (exec'd in place, so $! is the command's pid) gives each process its own process
    # group, which the final cleanup sweeps with KILL so no grandchild outlives the test.
    if command -v setsid >/dev/null; then
        setsid "$@" </dev/null >>"$T/$name.log" 2>&1 &
    else
        "$@" </dev/null >>"$T/$name.log" 2>&1 &
    fi
    local pid=$!
    if [[ -z "${OQ_PIDS[$name]:-}" ]]; then OQ_PID_ORDER+=("$name"); fi
    OQ_PIDS[$name]=$pid
    oq_log "spawned $name pid=$pid: $*"
    return 0
}

# Reap pid $1 when it is our child. `wait` returns the child's status (137 after a KILL, the
# exit code of one that failed): it must never reach `set -e` and end the calling test.
oq__reap() { wait "$1" 2>/dev/null || true; }

# Wait (bounded) for pid $1 to disappear; reaps it when it is our child. 0 if gone.
oq__wait_gone() {
    local pid=$1 tenths=$2 i
    for ((i = 0; i < tenths; i++)); do
        kill -0 "$pid" 2>/dev/null || { oq__reap "$pid"; return 0; }
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && return 1
    oq__reap "$pid"
    return 0
}

oq_kill() {
    local name=$1 sig=${2:-TERM}
    local pid=${OQ_PIDS[$name]:-}
    [[ -n "$pid" ]] || { oq_log "oq_kill: no process named '$name'"; return 1; }
    kill "-$sig" "$pid" 2>/dev/null || { oq__reap "$pid"; return 0; }
    case "$sig" in
    TERM | INT | 15 | 2)
        # OQ_KILL_GRACE (s, default 15): a loaded machine stops `onceq up` slowly when a
        # consumer leaves its group in the middle of a rebalance (4-8 s measured at load 3)
        local grace=${OQ_KILL_GRACE:-15}
        if ! oq__wait_gone "$pid" $((grace * 10)); then
            oq_log "oq_kill: $name pid=$pid ignored SIG$sig for $grace s, sending KILL"
            kill -KILL "$pid" 2>/dev/null
            oq__wait_gone "$pid" 50
        fi
        ;;
    KILL | 9)
        oq__wait_gone "$pid" 50
        ;;
    esac
    return 0
}

oq_wait_exit() {
    local name=$1 timeout=${2:-30}
    local pid=${OQ_PIDS[$name]:-} i rc
    [[ -n "$pid" ]] || { oq_log "oq_wait_exit: no process named '$name'"; return 127; }
    for ((i = 0; i < timeout * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null
            rc=$?
            return $rc
        fi
        sleep 0.1
    done
    return 124
}

oq_cleanup() {
    local rc=$? name pid h i
    [[ $OQ_CLEANED == 1 ]] && return $rc
    OQ_CLEANED=1
    trap - INT TERM
    for h in "${OQ_EXIT_HOOKS[@]}"; do eval "$h" || true; done
    for name in "${OQ_PID_ORDER[@]}"; do
        pid=${OQ_PIDS[$name]}
        kill -TERM "$pid" 2>/dev/null || true
    done
    for ((i = 0; i < 50; i++)); do
        local any=0
        for name in "${OQ_PID_ORDER[@]}"; do
            kill -0 "${OQ_PIDS[$name]}" 2>/dev/null && any=1
        done
        [[ $any == 0 ]] && break
        sleep 0.1
    done
    for name in "${OQ_PID_ORDER[@]}"; do
        pid=${OQ_PIDS[$name]}
        if kill -0 "$pid" 2>/dev/null; then
            echo "oq_cleanup: $name pid=$pid still alive after TERM + 5 s: KILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        oq__reap "$pid"
        # sweep the process group (leftover grandchildren); only our own groups (setsid)
        if [[ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]] ||
            pgrep -g "$pid" >/dev/null 2>&1; then
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
    done
    if [[ -n "${T:-}" && -d "$T" ]]; then
        if [[ "${ONCEQ_KEEP_TMP:-0}" == 1 ]]; then
            echo "kept temp dir: $T" >&2
        else
            rm -rf "$T"
        fi
    fi
    return $rc
}

trap 'oq_cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

oq_wait_for() {
    local timeout=$1 i
    shift
    for ((i = 0; i < timeout * 10; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    "$@" >/dev/null 2>&1
}

oq_tool() { echo "$ONCEQ_BUILD/$1"; }

oq_fail() {
    local name
    echo "FAIL: $*" >&2
    if [[ -n "${T:-}" && -d "$T" ]]; then
        for name in "${OQ_PID_ORDER[@]}"; do
            [[ -f "$T/$name.log" ]] || continue
            echo "---- tail of $name.log ----" >&2
            tail -n 25 "$T/$name.log" >&2
        done
    fi
    exit 1
}

oq_pass() { echo "PASS: $*"; }

# Ports come from below the kernel's ephemeral range (where the outgoing connections of every
# process on the machine take theirs), so a port found free is not taken a moment later by a
# client's connection.
oq_free_port() {
    local i p lo
    lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    ((lo > 12000)) || lo=61000
    for ((i = 0; i < 200; i++)); do
        p=$((10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000)))
        if ! ss -Htan 2>/dev/null | awk '{print $4}' | grep -q ":$p\$"; then
            echo "$p"
            return 0
        fi
    done
    echo "oq_free_port: no free port found" >&2
    return 1
}

# oq_start_broker [ARGS]: spawns the broker as "broker" with --bootstrap-file $T/bootstrap
# (its control FIFO is then $T/bootstrap.ctl, acks in $T/bootstrap.ctl.log).
oq_start_broker() {
    oq_tmpdir
    # the clients' defaults follow the brokers (kafka-profile, common/kafka.c): every onceq
    # command started after this reads ONCEQ_KAFKA_PROFILE
    if oq_real_kafka; then
        export ONCEQ_KAFKA_PROFILE=real
        oq__real_kafka_topics "$@"
        return 0
    fi
    export ONCEQ_KAFKA_PROFILE=mock
    local i ctl=$T/bootstrap.ctl a prev=
    for a in "$@"; do # an explicit --control PATH replaces the default FIFO path
        [[ $prev == --control ]] && ctl=$a
        [[ $a == --control=* ]] && ctl=${a#--control=}
        prev=$a
    done
    rm -f "$T/bootstrap"
    oq_spawn broker "$ONCEQ_BIN" broker --bootstrap-file "$T/bootstrap" "$@"
    for ((i = 0; i < 150; i++)); do
        [[ -s "$T/bootstrap" && -p "$ctl" ]] && break
        oq_alive broker || oq_fail "broker exited during start-up"
        sleep 0.1
    done
    [[ -s "$T/bootstrap" ]] || oq_fail "broker did not write $T/bootstrap within 15 s"
    BROKERS=$(cat "$T/bootstrap")
    BROKER_CTL=$ctl
    export BROKERS BROKER_CTL
    oq_log "broker up: BROKERS=$BROKERS BROKER_CTL=$BROKER_CTL"
    return 0
}

# oq_broker_ctl "COMMAND" [TIMEOUT_S]: one command to the broker's control FIFO. The broker
# appends one ack line per command to $BROKER_CTL.log ("ok ..." or "err ..."); this waits for
# the new line, prints it and returns 0 for "ok", 1 for "err" or no ack within the timeout.
# Not safe for two scripts writing the same FIFO at once (acks are matched by count).
oq_broker_ctl() {
    local cmd=$1 timeout=${2:-10} ctl=${BROKER_CTL:-} before i line
    if oq_real_kafka; then
        echo "oq_broker_ctl: fault commands need the embedded broker, not real Kafka" >&2
        return 1
    fi
    [[ -n "$ctl" && -p "$ctl" ]] || { echo "oq_broker_ctl: no control FIFO (BROKER_CTL='$ctl')" >&2; return 1; }
    before=0
    [[ -f "$ctl.log" ]] && before=$(wc -l <"$ctl.log")
    # Opening a FIFO for writing blocks without a reader: bound it in case the broker died.
    if ! timeout 5 bash -c 'printf "%s\n" "$1" >"$2"' _ "$cmd" "$ctl"; then
        echo "oq_broker_ctl: could not write to $ctl" >&2
        return 1
    fi
    for ((i = 0; i < timeout * 20; i++)); do
        if [[ -f "$ctl.log" ]] && (($(wc -l <"$ctl.log") > before)); then
            line=$(sed -n "$((before + 1))p" "$ctl.log")
            echo "$line"
            [[ "$line" == ok* ]] && return 0
            return 1
        fi
        sleep 0.05
    done
    echo "oq_broker_ctl: no ack for '$cmd' within ${timeout}s" >&2
    return 1
}

# --- real Kafka (ONCEQ_TEST_BROKERS) ---------------------------------------------------------

oq_real_kafka() { [[ -n "${ONCEQ_TEST_BROKERS:-}" ]]; }

oq_require_real_kafka() {
    oq_real_kafka && return 0
    if [[ "${CI:-}" == true ]]; then
        oq_fail "real-Kafka test without ONCEQ_TEST_BROKERS under CI=true (run scripts/test-real-kafka.sh)"
    fi
    echo "SKIP: needs a real Kafka cluster (ONCEQ_TEST_BROKERS; scripts/test-real-kafka.sh runs it)"
    exit 77
}

oq_kafka_cluster() {
    [[ -n "${ONCEQ_KAFKA_DIR:-}" ]] || oq_fail "ONCEQ_KAFKA_DIR is not set (the cluster's folder)"
    bash "$ONCEQ_SRC/scripts/kafka-cluster.sh" "$@" --dir "$ONCEQ_KAFKA_DIR"
}

# The real cluster stands in for `onceq broker [--partitions N] [--topics a,b:12]`: the onceq
# topics and the extra ones are deleted (with whatever an earlier script left in them and the
# group offsets on them) and created afresh, RF ONCEQ_TEST_RF, min.insync.replicas
# ONCEQ_TEST_MIN_ISR. Scripts therefore share a cluster one at a time, never in parallel.
# --topic-prefix P names the onceq topics P + tool-calls etc., as `onceq broker` does.
# --brokers and --control of the mock have no meaning here and are ignored.
oq__real_kafka_topics() {
    local parts=6 extra= prev= a t pfx=onceq.
    for a in "$@"; do
        [[ $prev == --partitions ]] && parts=$a
        [[ $a == --partitions=* ]] && parts=${a#--partitions=}
        [[ $prev == --topics ]] && extra=$a
        [[ $a == --topics=* ]] && extra=${a#--topics=}
        [[ $prev == --topic-prefix ]] && pfx=$a
        [[ $a == --topic-prefix=* ]] && pfx=${a#--topic-prefix=}
        prev=$a
    done
    if [[ -f "$ONCEQ_TEST_BROKERS" ]]; then
        BROKERS=$(cat "$ONCEQ_TEST_BROKERS")
    else
        BROKERS=$ONCEQ_TEST_BROKERS
    fi
    [[ -n "$BROKERS" ]] || oq_fail "ONCEQ_TEST_BROKERS ($ONCEQ_TEST_BROKERS) gives no bootstrap list"
    BROKER_CTL=
    export BROKERS BROKER_CTL
    local names=("${pfx}tool-calls" "${pfx}tool-results" "${pfx}dlq") specs=()
    IFS=, read -ra t <<<"$extra"
    for a in "${t[@]}"; do
        a=${a// /}
        [[ -n "$a" ]] || continue
        names+=("${a%%:*}")
        specs+=("$a")
    done
    "$ONCEQ_BIN" topics delete --if-exists --brokers "$BROKERS" "${names[@]}" >"$T/topics.log" 2>&1 ||
        { cat "$T/topics.log" >&2; oq_fail "real Kafka: could not delete the test topics"; }
    "$ONCEQ_BIN" topics create --brokers "$BROKERS" --partitions "$parts" \
        --replication-factor "${ONCEQ_TEST_RF:-3}" --min-insync-replicas "${ONCEQ_TEST_MIN_ISR:-2}" \
        "${names[@]:0:3}" "${specs[@]}" >>"$T/topics.log" 2>&1 ||
        { cat "$T/topics.log" >&2; oq_fail "real Kafka: could not create the test topics"; }
    oq_log "real Kafka: BROKERS=$BROKERS, topics recreated (${#names[@]}, $parts partitions each)"
    return 0
}

# --- PostgreSQL (ONCEQ_TEST_PG_URL, set by ./quickstart test from scripts/pg.sh) --------------

# oq_faketime OFFSET CMD...: run CMD with its wall clock moved by OFFSET (libfaketime's
# "+1h" / "-45s" forms), CLOCK_MONOTONIC untouched. It preloads Debian's libfaketimeMT itself
# rather than through the `faketime` wrapper: the wrapper hands its start time to the library in
# shared memory, and under load that handover sometimes gave a clock near 1970 (seen once in 7
# runs of test_pg_consumer_clock). Skips (exit 77) when the library is missing; fails under CI.
oq_faketime_lib() {
    local f
    for f in /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 \
        /usr/lib/*/faketime/libfaketimeMT.so.1 /usr/lib/faketime/libfaketimeMT.so.1; do
        [[ -r $f ]] && { echo "$f"; return 0; }
    done
    [[ "${CI:-}" == true ]] && oq_fail "libfaketime is required under CI=true (apt-get install faketime)"
    echo "SKIP: needs libfaketime (apt-get install faketime)"
    exit 77
}
oq_faketime() {
    local off=$1 lib
    shift
    lib=$(oq_faketime_lib) || exit $?
    env LD_PRELOAD="$lib" FAKETIME="$off" FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1 "$@"
}

oq_require_pg() {
    [[ -n "${ONCEQ_TEST_PG_URL:-}" ]] && return 0
    if [[ "${CI:-}" == true ]]; then
        oq_fail "PostgreSQL test without ONCEQ_TEST_PG_URL under CI=true (scripts/pg.sh start; export ONCEQ_TEST_PG_URL=\$(scripts/pg.sh url))"
    fi
    echo "SKIP: needs PostgreSQL (scripts/pg.sh start; export ONCEQ_TEST_PG_URL=\$(scripts/pg.sh url))"
    exit 77
}

# A fresh database NAME on the test server (dropped first); prints its URL (same passfile).
oq_pg_fresh_db() {
    local name=$1
    psql -XAtq "$ONCEQ_TEST_PG_URL" -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
    psql -XAtq "$ONCEQ_TEST_PG_URL" -c "CREATE DATABASE $name" >/dev/null ||
        oq_fail "cannot create database $name"
    echo "$ONCEQ_TEST_PG_URL" | sed -E "s|^(postgres(ql)?://[^/]*/)[^?]*|\1$name|"
}
