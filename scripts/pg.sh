#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A private PostgreSQL cluster on loopback for onceq's tests and local runs, from Debian's
# `postgresql` package. Never touches a system cluster.
#
#   scripts/pg.sh start [--dir D]   first start: initdb into D/data as an unprivileged user,
#        superuser `onceq` with a random password (kept only in D/pgpass, mode 600), database
#        `onceq`, a free loopback port (kept in D/port); later starts reuse D. Waits until the
#        server accepts connections. Already running: nothing to do.
#   scripts/pg.sh stop [--dir D]    SIGTERM (PostgreSQL's smart shutdown is SIGTERM; a fast one
#        is SIGINT: sent) the postmaster by the pid in D/data/postmaster.pid, KILL after 30 s
#   scripts/pg.sh url [--dir D]     the connection URI; the password is not in it: libpq reads
#        it from the passfile the URI names (postgresql://onceq@127.0.0.1:PORT/onceq?passfile=..)
#   scripts/pg.sh status [--dir D]  exit 0 when running
#   scripts/pg.sh pid [--dir D]     the postmaster's pid (empty when not running)
#
# Environment: ONCEQ_PG_DIR (default for --dir: build/pg under the source tree, ignored by
# git), ONCEQ_PG_USER (the system user the server runs as when started by root; default
# onceq-pg, created as a system user when missing, or `nobody` when it cannot be created).
# A password never appears on a command line or in a log: initdb reads it from a file that is
# removed afterwards, clients read D/pgpass.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-}
[[ $# -gt 0 ]] && shift
dir=${ONCEQ_PG_DIR:-$src/build/pg}
while [[ $# -gt 0 ]]; do
    case "$1" in
    --dir) dir=$2; shift 2 ;;
    --dir=*) dir=${1#*=}; shift ;;
    *) echo "pg.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
data=$dir/data

pgbin() {
    local b
    for b in /usr/lib/postgresql/*/bin; do
        [[ -x $b/pg_ctl ]] && { echo "$b"; return 0; }
    done
    command -v pg_ctl >/dev/null && { dirname "$(command -v pg_ctl)"; return 0; }
    echo "pg.sh: no PostgreSQL server binaries (apt-get install postgresql)" >&2
    return 1
}

# Runs "$@" as the cluster's owner (root starts the server as an unprivileged user).
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u "$owner" -- "$@"
    else
        "$@"
    fi
}

pick_owner() {
    owner=$(id -un)
    [[ $(id -u) -ne 0 ]] && return 0
    if [[ -f $dir/owner ]]; then
        owner=$(cat "$dir/owner")
        return 0
    fi
    owner=${ONCEQ_PG_USER:-onceq-pg}
    if ! id -u "$owner" >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            "$owner" >/dev/null 2>&1 || owner=nobody
    fi
    echo "$owner" >"$dir/owner"
}

# The postmaster's pid, when D/data/postmaster.pid names a live postgres of this data folder.
running_pid() {
    local pid
    [[ -f $data/postmaster.pid ]] || return 0
    pid=$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$data" || return 0
    echo "$pid"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

url() {
    echo "postgresql://onceq@127.0.0.1:$(cat "$dir/port")/onceq?passfile=$dir/pgpass&connect_timeout=10"
}

init_cluster() {
    local bin=$1 pwfile
    echo "pg.sh: initdb into $data (owner $owner)" >&2
    chmod 755 "$dir"
    as_owner test -x "$dir" || {
        echo "pg.sh: user $owner cannot reach $dir (a parent folder is closed to it)" >&2
        exit 1
    }
    mkdir -p "$data" "$dir/sock"
    chown "$owner" "$data" "$dir/sock" 2>/dev/null || true
    chmod 700 "$data"
    umask 077
    python3 -c 'import secrets; print(secrets.token_urlsafe(24))' >"$dir/password.tmp"
    pwfile=$dir/initdb-pw
    install -m 600 -o "$owner" /dev/null "$pwfile" 2>/dev/null || install -m 600 /dev/null "$pwfile"
    cat "$dir/password.tmp" >"$pwfile"
    as_owner "$bin/initdb" -D "$data" -U onceq --pwfile="$pwfile" --auth-host=scram-sha-256 \
        --auth-local=peer -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || {
        rm -f "$pwfile" "$dir/password.tmp"
        echo "pg.sh: initdb failed, see $dir/initdb.log" >&2
        exit 1
    }
    rm -f "$pwfile"
    free_port >"$dir/port"
    # hostname:port:database:username:password
    printf '127.0.0.1:%s:*:onceq:%s\n' "$(cat "$dir/port")" "$(cat "$dir/password.tmp")" \
        >"$dir/pgpass"
    chmod 600 "$dir/pgpass"
    rm -f "$dir/password.tmp"
    cat >>"$data/postgresql.conf" <<EOF
# onceq's private test cluster (scripts/pg.sh)
listen_addresses = '127.0.0.1'
port = $(cat "$dir/port")
unix_socket_directories = '$dir/sock'
max_connections = 200
fsync = on
synchronous_commit = on
log_min_messages = warning
log_connections = off
log_statement = 'none'
# Debian's default (128MB) holds less than one benchmark's dirty pages: backends then write
# dirty buffers out themselves on the hot path, and a run's p99 depends on what ran before it
# (docs/SCALING.md, "What one run left to the next"). Allocated on touch; give a server more.
shared_buffers = 1GB
EOF
    umask 022
}

start() {
    local bin pid i
    bin=$(pgbin)
    pick_owner
    pid=$(running_pid)
    if [[ -n $pid ]]; then
        echo "pg.sh: running (pid $pid) at $(url | sed 's/?.*//')" >&2
        return 0
    fi
    [[ -f $data/PG_VERSION ]] || init_cluster "$bin"
    # the port may have been taken meanwhile: pick another one (SO_REUSEADDR, as the server
    # binds: connections of the last run in TIME_WAIT do not make the port busy, so a restart
    # keeps its address and clients reconnect to it)
    if ! python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' \
        "$(cat "$dir/port")" 2>/dev/null; then
        local p
        p=$(free_port)
        sed -i "s/^port = .*/port = $p/" "$data/postgresql.conf"
        sed -i "s/^127.0.0.1:[0-9]*:/127.0.0.1:$p:/" "$dir/pgpass"
        echo "$p" >"$dir/port"
    fi
    touch "$dir/server.log"
    chown "$owner" "$dir/server.log" 2>/dev/null || true
    as_owner "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 start >/dev/null || {
        echo "pg.sh: the server did not start, see $dir/server.log" >&2
        exit 1
    }
    for i in $(seq 1 100); do
        if PGPASSFILE=$dir/pgpass "$bin/psql" -XAtq "$(url)" -c 'SELECT 1' >/dev/null 2>&1; then
            echo "pg.sh: started (pid $(running_pid)) at $(url | sed 's/?.*//')" >&2
            return 0
        fi
        [[ $i -eq 1 ]] && PGPASSFILE=$dir/pgpass "$bin/createdb" -h 127.0.0.1 \
            -p "$(cat "$dir/port")" -U onceq onceq >/dev/null 2>&1 || true
        sleep 0.2
    done
    echo "pg.sh: the server does not answer, see $dir/server.log" >&2
    exit 1
}

stop() {
    local pid i
    pid=$(running_pid)
    if [[ -z $pid ]]; then
        echo "pg.sh: not running" >&2
        return 0
    fi
    kill -INT "$pid" 2>/dev/null || true
    for i in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || { echo "pg.sh: stopped" >&2; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    echo "pg.sh: killed (pid $pid)" >&2
}

case "$cmd" in
start) start ;;
stop) stop ;;
url)
    [[ -f $dir/port ]] || { echo "pg.sh: no cluster in $dir (scripts/pg.sh start)" >&2; exit 1; }
    url
    ;;
status)
    pid=$(running_pid)
    [[ -n $pid ]] && { echo "running pid=$pid"; exit 0; }
    echo "stopped"
    exit 1
    ;;
pid) running_pid ;;
*)
    echo "usage: scripts/pg.sh start|stop|url|status|pid [--dir D]" >&2
    exit 2
    ;;
esac
