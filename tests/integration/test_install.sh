#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install: `cmake --install` into a temporary prefix, then use only what was installed.
# libonceq is the producer's client side: its headers install as <onceq/...> (Cflags
# -I$prefix/include, no generic names on the global include path) and each compiles alone;
# producer/examples/in_tx.c builds against the install with pkg-config alone, shared and with
# libonceq.a (`pkg-config --static`),
# and runs; the library needs SQLite, libpq (the in-transaction submit on a caller's PostgreSQL
# connection), jansson and libcrypto only (no librdkafka, libcurl,
# libmicrohttpd, libsystemd); it is silent in its host unless a log callback and level are set;
# libonceq.so exports exactly the functions the installed headers declare. Then: the installed
# binary runs; the bash completion script loads and completes commands, flags and enum values
# from the settings tables; the --help docs are there and name the environment variables.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
P=$T/prefix
CC=${CC:-cc}

cmake --install "$ONCEQ_BUILD" --prefix "$P" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; oq_fail "cmake --install failed"; }
HEADERS="oq_error.h oq_logger.h oq_client.h"
for f in bin/onceq bin/onceq-bench bin/onceq-downstream lib/libonceq.a lib/pkgconfig/libonceq.pc \
    share/bash-completion/completions/onceq share/doc/onceq/onceq-producer.txt; do
    [ -e "$P/$f" ] || oq_fail "not installed: $f"
done
for h in $HEADERS; do [ -e "$P/include/onceq/$h" ] || oq_fail "not installed: include/onceq/$h"; done
extra=$(cd "$P/include" && find . -type f | sort | grep -v -x -e ./onceq/oq_error.h \
    -e ./onceq/oq_logger.h -e ./onceq/oq_client.h)
[ -z "$extra" ] || oq_fail "headers installed beyond the client API: $extra"
ls "$P"/lib/libonceq.so.* >/dev/null 2>&1 || oq_fail "not installed: lib/libonceq.so.N"
"$P/bin/onceq" --version | grep -q '^onceq ' || oq_fail "installed onceq does not run"
oq_pass "installed: binaries, libonceq (shared + static), include/onceq/{$HEADERS}, libonceq.pc, completion, docs"

# Only the installed prefix: no source-tree include path, no build-tree library.
export PKG_CONFIG_PATH=$P/lib/pkgconfig
pkg-config --exists libonceq || oq_fail "pkg-config does not find libonceq"
case "$(pkg-config --cflags --libs libonceq)" in
*"$ONCEQ_SRC"* | *"$ONCEQ_BUILD"*) oq_fail "libonceq.pc points into the source or build tree" ;;
esac
pkg-config --cflags libonceq | grep -q -- "-I$P/include/onceq" &&
    oq_fail "libonceq.pc puts include/onceq on the include path: $(pkg-config --cflags libonceq)"
for h in $HEADERS; do
    printf '#include <onceq/%s>\nint main(void) { return 0; }\n' "$h" >"$T/h.c"
    $CC -std=c11 -Wall -Wextra -Werror -c -o "$T/h.o" "$T/h.c" $(pkg-config --cflags libonceq) \
        2>"$T/h.err" || { cat "$T/h.err" >&2; oq_fail "installed onceq/$h does not compile alone"; }
done
if grep -n '#include "' "$P"/include/onceq/*.h; then
    oq_fail "installed headers include each other by bare name, not as <onceq/...>"
fi
oq_pass "each installed header compiles on its own as <onceq/...> (C11, -Wall -Wextra -Werror) and names the others as <onceq/...>"

cp "$ONCEQ_SRC/producer/examples/in_tx.c" "$T/in_tx.c"
grep -q 'sqlite3_bind_text' "$T/in_tx.c" || oq_fail "in_tx.c binds no parameter"
grep -nE 'snprintf\([^;]*(INSERT|SELECT|UPDATE|DELETE)' "$T/in_tx.c" &&
    oq_fail "in_tx.c formats values into SQL text"
grep -q '#include <onceq/oq_client.h>' "$T/in_tx.c" || oq_fail "in_tx.c does not include <onceq/...>"
(cd "$T" && $CC -std=c11 -Wall -Werror -o in_tx in_tx.c $(pkg-config --cflags --libs libonceq)) \
    2>"$T/cc.err" || { cat "$T/cc.err" >&2; oq_fail "in_tx.c does not build against the install"; }
LD_LIBRARY_PATH=$P/lib ldd "$T/in_tx" | grep -q "libonceq.so.0 => $P/lib/" ||
    oq_fail "in_tx is not linked to the installed libonceq.so"
needed=$(readelf -d "$P"/lib/libonceq.so | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | sort |
    tr '\n' ' ')
for n in $needed; do
    case "$n" in
    libsqlite3.so.* | libpq.so.* | libjansson.so.* | libcrypto.so.* | libc.so.* | libm.so.* | ld-linux*) ;;
    *) oq_fail "libonceq.so needs $n (expected only SQLite, libpq, jansson, libcrypto, libc): $needed" ;;
    esac
done
# A fresh database: the migration logs a line, which a library must keep to itself, whatever
# ONCEQ_LOG_LEVEL says; with -v the example sets a callback and a level and receives it.
ONCEQ_LOG_LEVEL=debug LD_LIBRARY_PATH=$P/lib "$T/in_tx" "$T/shop.db" >"$T/in_tx.out" \
    2>"$T/in_tx.err" || { cat "$T/in_tx.out" "$T/in_tx.err" >&2; oq_fail "in_tx (shared) failed"; }
grep -q "committed with call c_" "$T/in_tx.out" || oq_fail "in_tx did not commit a call"
grep -q "lookup by key -> call c_" "$T/in_tx.out" || oq_fail "in_tx: the lookup by key failed"
grep -q "rows of the rolled-back order: 0" "$T/in_tx.out" || oq_fail "in_tx rollback left rows"
[ -s "$T/in_tx.err" ] && oq_fail "libonceq wrote to its host's stderr: $(cat "$T/in_tx.err")"
grep -q '^onceq: ' "$T/in_tx.out" && oq_fail "libonceq logged without a callback: $(cat "$T/in_tx.out")"
LD_LIBRARY_PATH=$P/lib "$T/in_tx" -v "$T/shop-v.db" >"$T/in_tx-v.out" 2>"$T/in_tx-v.err" ||
    { cat "$T/in_tx-v.out" "$T/in_tx-v.err" >&2; oq_fail "in_tx -v failed"; }
grep -q '^onceq: .*component=db msg="migrated schema' "$T/in_tx-v.out" ||
    oq_fail "in_tx -v: the log callback did not receive the migration line"
[ -s "$T/in_tx-v.err" ] && oq_fail "in_tx -v: lines reached stderr despite the callback"
oq_pass "in_tx.c built with pkg-config alone against libonceq.so (needs: $needed), ran: order + call committed; silent by default, lines through oq_log_set_callback"

# Static: libonceq.a linked in, with what `pkg-config --static` names (no -dev package beyond
# SQLite, libpq, jansson, OpenSSL). Not fully static: libonceq carries the in-transaction submit
# on a caller's PostgreSQL connection, and Debian ships no static form of libpq's own
# dependencies (Kerberos, LDAP), so the system libraries stay shared.
(cd "$T" && $CC -std=c11 -Wall -Werror -o in_tx_static in_tx.c "$P/lib/libonceq.a" \
    $(pkg-config --static --cflags --libs libonceq | sed 's/ -lonceq / /')) 2>"$T/cc2.err" ||
    { cat "$T/cc2.err" >&2; oq_fail "in_tx.c does not link with libonceq.a and pkg-config --static"; }
readelf -d "$T/in_tx_static" | grep -q 'Shared library: \[libonceq' &&
    oq_fail "in_tx_static needs libonceq.so: $(readelf -d "$T/in_tx_static" | grep NEEDED)"
"$T/in_tx_static" "$T/shop.db" >"$T/in_tx2.out" 2>&1 ||
    { cat "$T/in_tx2.out" >&2; oq_fail "in_tx (static) failed"; }
grep -q "orders=2 calls=2 outbox=2" "$T/in_tx2.out" ||
    oq_fail "second run: expected 2 orders, 2 calls, 2 outbox rows: $(cat "$T/in_tx2.out")"
oq_pass "in_tx.c linked with libonceq.a (pkg-config --static), ran on the same database"

# The exported dynamic symbols are exactly the functions the installed headers declare.
python3 - "$P"/include/onceq/*.h >"$T/declared" <<'PY' || oq_fail "cannot read the headers"
import re, sys
names = set()
for f in sys.argv[1:]:
    s = open(f).read()
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    s = re.sub(r"^\s*#.*$", "", s, flags=re.M)
    names |= set(re.findall(r"\b(oq_[a-z0-9_]+)\s*\(", s))
print("\n".join(sorted(names)))
PY
nm -D --defined-only "$P"/lib/libonceq.so | awk '{print $3}' | sed 's/@.*//' | sort -u \
    >"$T/exported"
[ "$(wc -l <"$T/declared")" -ge 10 ] || oq_fail "found too few declarations: $(cat "$T/declared")"
diff "$T/declared" "$T/exported" >"$T/sym.diff" ||
    oq_fail "libonceq.so exports differ from the headers (< declared only, > exported only):
$(cat "$T/sym.diff")"
oq_pass "libonceq.so exports exactly the $(wc -l <"$T/declared") functions its installed headers declare"

# Completion: loads in bash, completes commands, flags of a command and an enum's values.
complete_words() { # complete_words WORD...: the completions of the last word
    PATH=$P/bin:$PATH bash -c '
        source "$1" || exit 9
        shift
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        _onceq
        printf "%s\n" "${COMPREPLY[@]}"' _ "$P/share/bash-completion/completions/onceq" "$@"
}
PATH=$P/bin:$PATH bash -c 'source "$1" && complete -p onceq' _ \
    "$P/share/bash-completion/completions/onceq" | grep -q '_onceq' ||
    oq_fail "the completion script does not register for onceq"
[ "$(complete_words onceq rel)" = relay ] || oq_fail "onceq rel<TAB>: $(complete_words onceq rel)"
out=$(complete_words onceq relay --batch-)
echo "$out" | grep -qx -- --batch-rows || oq_fail "onceq relay --batch-<TAB>: $out"
echo "$out" | grep -qx -- --batch-bytes || oq_fail "onceq relay --batch-<TAB>: $out"
[ "$(complete_words onceq relay --synchronous '' | sort | tr '\n' ' ')" = "full normal off " ] ||
    oq_fail "onceq relay --synchronous <TAB>: $(complete_words onceq relay --synchronous '')"
oq_pass "completion: commands, a command's flags, enum values"

grep -q 'env ONCEQ_KEY_TTL' "$P/share/doc/onceq/onceq-producer.txt" ||
    oq_fail "onceq-producer.txt lacks the environment names"
grep -q 'precedence: flag > environment > file' "$P/share/doc/onceq/onceq-relay.txt" ||
    oq_fail "onceq-relay.txt lacks the precedence"
oq_pass "docs: share/doc/onceq/onceq-<command>.txt from --help"
