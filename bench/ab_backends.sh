#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two builds side by side on both backends, alternating in one run so that the machine's load
# falls on both alike: for each pair, OLD then NEW, each `onceq-bench e2e` (the command of
# `make bench` section 13) on SQLite and then on PostgreSQL (a fresh database each).
#
#   bash bench/ab_backends.sh OLD_BUILD_DIR NEW_BUILD_DIR [PAIRS]   (default 3 pairs)
#   AB_BENCH=consumer bash bench/ab_backends.sh ...                 the consumer benchmark instead
#   AB_BACKENDS=pg bash bench/ab_backends.sh ...                    PostgreSQL only
#
# PostgreSQL: the private cluster of scripts/pg.sh in AB_PG_DIR (default build/pg; started if
# not running, stopped at the end only if started here). One line per run: its `result` line.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=${1:?OLD build dir}
NEW=${2:?NEW build dir}
PAIRS=${3:-3}
PGD=${AB_PG_DIR:-$ROOT/build/pg}
started=0
if ! bash "$ROOT/scripts/pg.sh" url --dir "$PGD" >/dev/null 2>&1 ||
    ! psql -XAtq "$(bash "$ROOT/scripts/pg.sh" url --dir "$PGD")" -c "SELECT 1" >/dev/null 2>&1; then
    bash "$ROOT/scripts/pg.sh" start --dir "$PGD" >/dev/null || exit 1
    started=1
fi
PGURL=$(bash "$ROOT/scripts/pg.sh" url --dir "$PGD")
export ONCEQ_BENCH_PG_PID=$(bash "$ROOT/scripts/pg.sh" pid --dir "$PGD")
pgdb() { # a fresh database NAME; prints its URL
    psql -XAtq "$PGURL" -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" -c "CREATE DATABASE $1" >/dev/null 2>&1
    sed -E "s|^(postgres(ql)?://[^/]*/)[^?]*|\1$1|" <<<"$PGURL"
}
if [[ ${AB_BENCH:-e2e} == consumer ]]; then
    export ONCEQ_BIN=$NEW/onceq ONCEQ_BUILD=$NEW ONCEQ_SRC=$ROOT
    . "$ROOT/tests/integration/lib.sh"
fi
for pair in $(seq 1 "$PAIRS"); do
    for v in old new; do
        B=$NEW
        [[ $v == old ]] && B=$OLD
        for be in ${AB_BACKENDS:-sqlite pg}; do
            if [[ ${AB_BENCH:-e2e} == consumer ]]; then
                dbo=()
                [[ $be == pg ]] && dbo=(--db "$(pgdb bench_ab_consumer)")
                oq_start_broker --partitions 8
                out=$("$B/onceq-bench" consumer --brokers "$BROKERS" --calls 5000 --rounds 1 \
                    --dir "$T" "${dbo[@]}" 2>&1)
                oq_kill broker
            else
                eo=()
                [[ $be == pg ]] && eo=(--db-url "$(pgdb bench_ab_e2e)")
                out=$("$B/onceq-bench" e2e --onceq "$B/onceq" --calls 5000 --rate 0 --conns 64 \
                    --consumers 2 --no-baseline "${eo[@]}" 2>&1)
            fi
            echo "pair=$pair build=$v backend=$be load=$(cut -d' ' -f1 /proc/loadavg)" \
                "$(grep '^result ' <<<"$out" | tail -n1)"
        done
    done
done
((started)) && bash "$ROOT/scripts/pg.sh" stop --dir "$PGD" >/dev/null
exit 0
