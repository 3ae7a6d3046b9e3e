#!/usr/bin/env bash
# Install: `cmake --install` into a temporary prefix, then use only what was installed.
# producer/examples/in_tx.c builds against the installed headers with pkg-config alone (shared
# and static libonceq) and runs; each public header compiles on its own; the installed binary
# runs; the bash completion script loads and completes commands, flags and enum values from
# the settings tables; the --help docs are there and name the environment variables.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
P=$T/prefix
CC=${CC:-cc}

cmake --install "$ONCEQ_BUILD" --prefix "$P" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; oq_fail "cmake --install failed"; }
for f in bin/onceq bin/onceq-bench include/onceq/oq_producer.h include/onceq/oq_db.h \
    include/onceq/oq_error.h include/onceq/oq_catalog.h include/onceq/oq_jschema.h lib/libonceq.a lib/pkgconfig/libonceq.pc \
    share/bash-completion/completions/onceq share/doc/onceq/onceq-producer.txt; do
    [ -e "$P/$f" ] || oq_fail "not installed: $f"
done
ls "$P"/lib/libonceq.so.* >/dev/null 2>&1 || oq_fail "not installed: lib/libonceq.so.N"
"$P/bin/onceq" --version | grep -q '^onceq ' || oq_fail "installed onceq does not run"
oq_pass "installed: binaries, libonceq (shared + static), headers, libonceq.pc, completion, docs"

# Only the installed prefix: no source-tree include path, no build-tree library.
export PKG_CONFIG_PATH=$P/lib/pkgconfig
pkg-config --exists libonceq || oq_fail "pkg-config does not find libonceq"
case "$(pkg-config --cflags --libs libonceq)" in
*"$ONCEQ_SRC"* | *"$ONCEQ_BUILD"*) oq_fail "libonceq.pc points into the source or build tree" ;;
esac
for h in oq_error.h oq_db.h oq_producer.h oq_catalog.h oq_jschema.h; do
    printf '#include "%s"\nint main(void) { return 0; }\n' "$h" >"$T/h.c"
    $CC -std=c11 -Wall -Wextra -Werror -c -o "$T/h.o" "$T/h.c" $(pkg-config --cflags libonceq) \
        2>"$T/h.err" || { cat "$T/h.err" >&2; oq_fail "installed $h does not compile alone"; }
done
oq_pass "each installed header compiles on its own (C11, -Wall -Wextra -Werror)"

cp "$ONCEQ_SRC/producer/examples/in_tx.c" "$T/in_tx.c"
(cd "$T" && $CC -std=c11 -Wall -Werror -o in_tx in_tx.c $(pkg-config --cflags --libs libonceq)) \
    2>"$T/cc.err" || { cat "$T/cc.err" >&2; oq_fail "in_tx.c does not build against the install"; }
LD_LIBRARY_PATH=$P/lib ldd "$T/in_tx" | grep -q "libonceq.so.0 => $P/lib/" ||
    oq_fail "in_tx is not linked to the installed libonceq.so"
LD_LIBRARY_PATH=$P/lib "$T/in_tx" "$T/shop.db" >"$T/in_tx.out" 2>&1 ||
    { cat "$T/in_tx.out" >&2; oq_fail "in_tx (shared) failed"; }
grep -q "committed with call c_" "$T/in_tx.out" || oq_fail "in_tx did not commit a call"
grep -q "rows of the rolled-back order: 0" "$T/in_tx.out" || oq_fail "in_tx rollback left rows"
oq_pass "in_tx.c built with pkg-config alone against libonceq.so, ran: order + call committed"

# Static: the archive plus the libraries its .pc names as private dependencies (linked
# shared: `pkg-config --static` would also want the static archives of librdkafka's own
# compression libraries, which Debian's -dev packages do not all ship).
libs="$(pkg-config --libs libonceq | sed 's/-lonceq//') -lpthread -lm"
libs+=" $(pkg-config --libs $(pkg-config --print-requires-private libonceq | awk '{print $1}'))"
(cd "$T" && $CC -std=c11 -Wall -Werror -o in_tx_static in_tx.c \
    $(pkg-config --cflags libonceq) "$P/lib/libonceq.a" $libs) 2>"$T/cc2.err" ||
    { cat "$T/cc2.err" >&2; oq_fail "in_tx.c does not build against libonceq.a"; }
ldd "$T/in_tx_static" | grep -q libonceq && oq_fail "in_tx_static still needs libonceq.so"
"$T/in_tx_static" "$T/shop.db" >"$T/in_tx2.out" 2>&1 ||
    { cat "$T/in_tx2.out" >&2; oq_fail "in_tx (static) failed"; }
grep -q "orders=2 calls=2 outbox=2" "$T/in_tx2.out" ||
    oq_fail "second run: expected 2 orders, 2 calls, 2 outbox rows: $(cat "$T/in_tx2.out")"
oq_pass "in_tx.c built against libonceq.a, ran on the same database"

# The shared library exports public names only.
nm -D --defined-only "$P"/lib/libonceq.so | grep -q ' T oq_producer_submit_in_tx$' ||
    oq_fail "libonceq.so does not export oq_producer_submit_in_tx"
if nm -D --defined-only "$P"/lib/libonceq.so | grep -q ' T oq__'; then
    oq_fail "libonceq.so exports oq__ internals"
fi
oq_pass "libonceq.so exports oq_* and no oq__* symbol"

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
