#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A local Apache Kafka cluster (KRaft, every node broker + controller) on loopback, for the
# real-Kafka tests, chaos runs and benchmarks. Jars come from scripts/kafka-fetch.sh's cache.
#
#   scripts/kafka-cluster.sh start [--nodes 3] [--dir D] [--bootstrap-file F]
#        First start in D: picks free loopback ports, writes each node's server.properties,
#        formats its storage (one cluster id, a static quorum of all N nodes as voters), then
#        starts the nodes. Later starts in D reuse the ports and the data and start only the
#        nodes that are not running. Waits until the metadata lists N brokers (kcat -L), then
#        writes the bootstrap list to D/bootstrap and, with --bootstrap-file, to F (tmp+rename).
#   scripts/kafka-cluster.sh stop [--dir D]        SIGTERM every node by its pid, KILL after 10 s
#   scripts/kafka-cluster.sh status [--dir D]      one line per node; exit 0 when all run
#   scripts/kafka-cluster.sh wait-ready [--dir D] [--timeout S] [--brokers N]
#   scripts/kafka-cluster.sh pid I [--dir D]       the pid of node I (empty when not running)
#   scripts/kafka-cluster.sh kill-node I [SIG] [--dir D]   signal node I (default KILL; STOP
#        and CONT pause and resume it); KILL/TERM wait until the process is gone
#   scripts/kafka-cluster.sh stop-node I [--dir D] / start-node I [--dir D]
#   scripts/kafka-cluster.sh restart-node I [--dir D]  stop it if running (TERM), start it on
#        the same data and wait until the cluster lists every broker again
#   scripts/kafka-cluster.sh bootstrap [--dir D]   print the bootstrap list
#
# Environment: ONCEQ_KAFKA_DIR (default for --dir: ./onceq-kafka), ONCEQ_KAFKA_CACHE (see
# kafka-fetch.sh), JAVA (default java), ONCEQ_KAFKA_HEAP (default "-Xmx256m -Xms128m"),
# ONCEQ_KAFKA_JVM_OPTS (extra JVM options), ONCEQ_KAFKA_PROPS (extra server.properties lines,
# newline-separated, appended at the first start).
#
# Processes are tracked by pid files (D/node-I/pid) and a pid is only trusted while
# /proc/PID/cmdline still names that node's server.properties, so a recycled pid is never
# signalled. Node output goes to D/node-I/node.log.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-}
[[ $# -gt 0 ]] && shift

dir=${ONCEQ_KAFKA_DIR:-$PWD/onceq-kafka}
nodes=3
bootstrap_file=
timeout_s=90
want_brokers=
node_arg=
sig_arg=
while [[ $# -gt 0 ]]; do
    case "$1" in
    --dir) dir=$2; shift 2 ;;
    --dir=*) dir=${1#*=}; shift ;;
    --nodes) nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --bootstrap-file) bootstrap_file=$2; shift 2 ;;
    --bootstrap-file=*) bootstrap_file=${1#*=}; shift ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --timeout=*) timeout_s=${1#*=}; shift ;;
    --brokers) want_brokers=$2; shift 2 ;;
    --brokers=*) want_brokers=${1#*=}; shift ;;
    -*) echo "kafka-cluster: unknown option $1" >&2; exit 2 ;;
    *)
        if [[ -z "$node_arg" ]]; then node_arg=$1; elif [[ -z "$sig_arg" ]]; then sig_arg=$1; else
            echo "kafka-cluster: unexpected argument $1" >&2; exit 2
        fi
        shift
        ;;
    esac
done
[[ "$dir" == /* ]] || dir=$PWD/$dir
[[ "$nodes" =~ ^[1-9]$ ]] || { echo "kafka-cluster: --nodes must be 1..9" >&2; exit 2; }

say() { echo "kafka-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e '/SPDX-License-Identifier/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

# Listening ports are taken below the kernel's ephemeral range: a client that keeps
# reconnecting to a dead node's port inside that range can be handed that very port as its
# own local port and connect to itself (TCP self-connect), and the restarted node then fails
# with "Address already in use".
free_port() {
    local i p lo
    lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    ((lo > 12000)) || die "the ephemeral port range starts at $lo: no room below it for the nodes"
    for ((i = 0; i < 200; i++)); do
        p=$((10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000)))
        if ! ss -Htan 2>/dev/null | awk '{print $4}' | grep -q ":$p\$" &&
            ! grep -qw "$p" "$dir/ports.tmp" 2>/dev/null; then
            echo "$p" >>"$dir/ports.tmp"
            echo "$p"
            return 0
        fi
    done
    die "no free loopback port found"
}

load_env() {
    [[ -f "$dir/cluster.env" ]] || die "no cluster in $dir (run: kafka-cluster.sh start --dir $dir)"
    # shellcheck disable=SC1091
    . "$dir/cluster.env"
}

props_of() { echo "$dir/node-$1/server.properties"; }

# pid of node I if that process is alive and is that node; empty otherwise.
node_pid() {
    local i=$1 pid cl
    [[ -f "$dir/node-$i/pid" ]] || return 0
    pid=$(cat "$dir/node-$i/pid")
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    cl=$( { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) || return 0
    [[ "$cl" == *"kafka.Kafka $(props_of "$i")"* ]] && echo "$pid"
    return 0
}

check_java() {
    local j=${JAVA:-java} v
    command -v "$j" >/dev/null || die "java not found (Java 17+ runs the broker; Debian: default-jre-headless)"
    v=$("$j" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
    [[ "${v%%.*}" -ge 17 ]] 2>/dev/null || die "Java $v found; Kafka $KAFKA_VERSION needs 17 or newer"
}

libs_dir() {
    local cache
    cache=$("$src/scripts/kafka-fetch.sh" --print)
    "$src/scripts/kafka-fetch.sh" --check ||
        die "Kafka jars not fetched into $cache (run scripts/kafka-fetch.sh)"
    echo "$cache/libs"
}

jvm_cmd() { # the java command line of node I, minus the main class arguments
    local i=$1
    # shellcheck disable=SC2206
    local heap=(${ONCEQ_KAFKA_HEAP:--Xmx256m -Xms128m}) extra=(${ONCEQ_KAFKA_JVM_OPTS:-})
    JVM=("${JAVA:-java}" "${heap[@]}" -XX:+UseSerialGC -XX:CICompilerCount=2
        -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
        -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir/node-$i"
        "${extra[@]}" -cp "$LIBS/*")
}

write_config() {
    local i voters= sep= extra
    mkdir -p "$dir"
    rm -f "$dir/ports.tmp"
    for ((i = 1; i <= nodes; i++)); do
        eval "BPORT_$i=$(free_port)"
        eval "CPORT_$i=$(free_port)"
    done
    rm -f "$dir/ports.tmp"
    for ((i = 1; i <= nodes; i++)); do
        eval "voters+=\"$sep$i@127.0.0.1:\$CPORT_$i\""
        sep=,
    done
    # Cluster ids are 16 random bytes in unpadded base64url that must not start with '-'.
    local cid=-
    while [[ "$cid" == -* ]]; do
        cid=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    done
    local rf=$((nodes < 3 ? nodes : 3)) isr=$((nodes < 3 ? 1 : 2))
    {
        echo "NODES=$nodes"
        echo "CLUSTER_ID=$cid"
        echo "KAFKA_VERSION=$KAFKA_VERSION"
        for ((i = 1; i <= nodes; i++)); do
            eval "echo BPORT_$i=\$BPORT_$i; echo CPORT_$i=\$CPORT_$i"
        done
    } >"$dir/cluster.env.tmp"
    cat >"$dir/log4j2.properties" <<'EOF'
# Broker logs: INFO to stdout (the node's node.log), without the config dumps.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.config.name = org.apache.kafka.common.config
logger.config.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
    for ((i = 1; i <= nodes; i++)); do
        mkdir -p "$dir/node-$i/data"
        local bp cp
        eval "bp=\$BPORT_$i; cp=\$CPORT_$i"
        cat >"$(props_of "$i")" <<EOF
# Node $i of a local test cluster (written by scripts/kafka-cluster.sh).
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$bp,CONTROLLER://127.0.0.1:$cp
advertised.listeners=PLAINTEXT://127.0.0.1:$bp
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/node-$i/data

# Topics are created explicitly (onceq topics create); a typo must not create one.
auto.create.topics.enable=false
num.partitions=6
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=6
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
unclean.leader.election.enable=false

# Small: three nodes share 2 cores and small heaps.
num.network.threads=2
num.io.threads=4
num.replica.fetchers=1
background.threads=4
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=4194304
log.segment.bytes=8388608
log.retention.check.interval.ms=30000
# A dead node is fenced (and its partitions led elsewhere) within ~6 s.
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
replica.lag.time.max.ms=10000
EOF
        [[ -n "${ONCEQ_KAFKA_PROPS:-}" ]] && printf '%s\n' "$ONCEQ_KAFKA_PROPS" >>"$(props_of "$i")"
    done
    mv "$dir/cluster.env.tmp" "$dir/cluster.env"
    say "configured $nodes nodes in $dir (cluster id $cid, voters $voters)"
}

format_storage() {
    local i pids=() rc=0
    for ((i = 1; i <= nodes; i++)); do
        [[ -f "$dir/node-$i/data/meta.properties" ]] && continue
        jvm_cmd "$i"
        "${JVM[@]}" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$(props_of "$i")" \
            >"$dir/node-$i/format.log" 2>&1 &
        pids+=("$!:$i")
    done
    for p in "${pids[@]}"; do
        wait "${p%%:*}" || { rc=1; say "formatting node ${p#*:} failed:"; cat "$dir/node-${p#*:}/format.log" >&2; }
    done
    [[ $rc == 0 ]] || exit 1
    [[ ${#pids[@]} -gt 0 ]] && say "formatted storage of ${#pids[@]} node(s)"
    return 0
}

start_node() {
    local i=$1 pid
    pid=$(node_pid "$i")
    if [[ -n "$pid" ]]; then
        say "node $i already running (pid $pid)"
        return 0
    fi
    jvm_cmd "$i"
    echo "==== start $(date '+%F %T')" >>"$dir/node-$i/node.log"
    # setsid: its own session, so a Ctrl-C or a test's process-group kill does not reach the
    # node; the node is stopped by its pid only. setsid execs in place: $! is the JVM's pid.
    setsid "${JVM[@]}" kafka.Kafka "$(props_of "$i")" </dev/null >>"$dir/node-$i/node.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/node-$i/pid.tmp" && mv "$dir/node-$i/pid.tmp" "$dir/node-$i/pid"
    say "started node $i pid $pid (broker 127.0.0.1:$(eval echo "\$BPORT_$i"))"
}

bootstrap_list() {
    local i s= sep=
    for ((i = 1; i <= NODES; i++)); do
        s+="${sep}127.0.0.1:$(eval echo "\$BPORT_$i")"
        sep=,
    done
    echo "$s"
}

write_bootstrap() {
    local f=$1 b
    b=$(bootstrap_list)
    mkdir -p "$(dirname "$f")"
    echo "$b" >"$f.tmp.$$" && mv "$f.tmp.$$" "$f"
}

# Number of brokers in the metadata, asked of the bootstrap list.
broker_count() {
    { kcat -L -b "$(bootstrap_list)" -m 3 -t __none__ 2>/dev/null || true; } |
        sed -n 's/^ *\([0-9]*\) brokers:.*/\1/p' | head -n1
}

wait_ready() {
    local want=${1:-$NODES} t0=$SECONDS n i alive
    while ((SECONDS - t0 < timeout_s)); do
        n=$(broker_count)
        [[ "${n:-0}" -ge "$want" ]] && { say "ready: $n brokers at $(bootstrap_list) (${SECONDS}s)"; return 0; }
        alive=0
        for ((i = 1; i <= NODES; i++)); do [[ -n "$(node_pid "$i")" ]] && alive=$((alive + 1)); done
        ((alive >= want)) || die "only $alive node(s) running, $want wanted; see $dir/node-*/node.log"
        sleep 0.5
    done
    die "the metadata lists ${n:-0} brokers after ${timeout_s}s, $want wanted; see $dir/node-*/node.log"
}

wait_gone() { # pid node tenths
    local pid=$1 i=$2 t
    for ((t = 0; t < $3; t++)); do
        [[ -z "$(node_pid "$i")" ]] && return 0
        [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == Z ]] && return 0
        sleep 0.1
    done
    return 1
}

# stop_nodes GRACE_S node ids...: TERM all, wait up to GRACE_S for each, then KILL the ones left.
stop_nodes() {
    local grace=$1 i pid left=() t
    shift
    for i in "$@"; do
        pid=$(node_pid "$i")
        [[ -n "$pid" ]] || continue
        kill -CONT "$pid" 2>/dev/null || true # a paused node cannot handle TERM
        kill -TERM "$pid" 2>/dev/null || true
        left+=("$i:$pid")
    done
    for t in "${left[@]}"; do
        i=${t%%:*}
        pid=${t#*:}
        if ! wait_gone "$pid" "$i" $((grace * 10)); then
            say "node $i pid $pid still running $grace s after TERM: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" "$i" 100 || say "node $i pid $pid did not die"
        fi
        rm -f "$dir/node-$i/pid"
        say "stopped node $i (pid $pid)"
    done
}

need_node() {
    [[ "$node_arg" =~ ^[0-9]+$ ]] && ((node_arg >= 1 && node_arg <= NODES)) ||
        die "node must be 1..$NODES, got '${node_arg}'"
}

case "$cmd" in
start)
    mkdir -p "$dir"
    KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$src/kafka/pom.xml" | head -n1)
    LIBS=$(libs_dir)
    check_java
    if [[ ! -f "$dir/cluster.env" ]]; then
        write_config
    fi
    load_env
    nodes=$NODES
    format_storage
    for ((i = 1; i <= NODES; i++)); do start_node "$i"; done
    wait_ready "$NODES"
    write_bootstrap "$dir/bootstrap"
    [[ -n "$bootstrap_file" ]] && write_bootstrap "$bootstrap_file"
    bootstrap_list
    ;;
stop)
    load_env
    ids=()
    for ((i = NODES; i >= 1; i--)); do ids+=("$i"); done
    # When the whole cluster goes, the last nodes can lose their quorum and hang in controlled
    # shutdown: 10 s of grace, then KILL (the next start recovers the logs).
    stop_nodes 10 "${ids[@]}"
    ;;
status)
    load_env
    all=0
    for ((i = 1; i <= NODES; i++)); do
        pid=$(node_pid "$i")
        st=running
        [[ -z "$pid" ]] && { st=stopped; all=1; }
        [[ -n "$pid" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" == T ]] && st=paused
        echo "node $i ${st} pid=${pid:--} broker=127.0.0.1:$(eval echo "\$BPORT_$i") controller=127.0.0.1:$(eval echo "\$CPORT_$i")"
    done
    echo "metadata brokers: $(broker_count || true)"
    exit $all
    ;;
wait-ready)
    load_env
    wait_ready "${want_brokers:-$NODES}"
    ;;
pid)
    load_env
    need_node
    node_pid "$node_arg"
    ;;
kill-node)
    load_env
    need_node
    sig=${sig_arg:-KILL}
    pid=$(node_pid "$node_arg")
    [[ -n "$pid" ]] || die "node $node_arg is not running"
    kill "-$sig" "$pid"
    say "sent SIG$sig to node $node_arg (pid $pid)"
    case "$sig" in
    KILL | 9 | TERM | 15)
        wait_gone "$pid" "$node_arg" 300 || die "node $node_arg pid $pid still alive"
        rm -f "$dir/node-$node_arg/pid"
        ;;
    esac
    ;;
stop-node)
    load_env
    need_node
    stop_nodes 30 "$node_arg"
    ;;
start-node | restart-node)
    load_env
    need_node
    KAFKA_VERSION=${KAFKA_VERSION:-}
    LIBS=$(libs_dir)
    [[ "$cmd" == restart-node ]] && stop_nodes 30 "$node_arg"
    start_node "$node_arg"
    wait_ready "$NODES"
    ;;
bootstrap)
    load_env
    bootstrap_list
    ;;
*)
    usage
    ;;
esac
