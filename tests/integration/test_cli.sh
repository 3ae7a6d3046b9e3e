#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The command line around the commands: `onceq help CMD` prints CMD's help for every command;
# `CMD --help` writes nothing on stderr (no daemon start/stop log lines, e.g. the producer's
# "stopped"); kcat's `-b` is --brokers wherever --brokers is (and unknown elsewhere); the bash
# completion completes the actions of `review`, `dlq` and `topics`, and the
# command after `help`.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

# --- onceq help CMD == onceq CMD --help, and --help is silent on stderr -----------------------
cmds=$("$ONCEQ_BIN" --help | awk '/^commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}')
(($(wc -w <<<"$cmds") >= 15)) || oq_fail "could not read the command list: $cmds"
for c in $cmds; do
    "$ONCEQ_BIN" "$c" --help >"$T/h1" 2>"$T/e1"
    rc1=$?
    "$ONCEQ_BIN" help "$c" >"$T/h2" 2>"$T/e2"
    rc2=$?
    [[ $rc1 == 0 && $rc2 == 0 ]] || oq_fail "$c: --help exit $rc1, help exit $rc2"
    [[ -s "$T/h1" ]] || oq_fail "$c --help printed nothing"
    cmp -s "$T/h1" "$T/h2" || oq_fail "onceq help $c differs from onceq $c --help"
    [[ ! -s "$T/e1" && ! -s "$T/e2" ]] || oq_fail "$c --help wrote on stderr: $(cat "$T/e1" "$T/e2")"
done
"$ONCEQ_BIN" help no-such-command >/dev/null 2>"$T/e3"
[[ $? == 2 ]] || oq_fail "onceq help no-such-command: want exit 2"
grep -q "unknown command 'no-such-command'" "$T/e3" || oq_fail "help of an unknown command: $(cat "$T/e3")"
"$ONCEQ_BIN" help | grep -q "^commands:" || oq_fail "onceq help: no command list"
oq_pass "onceq help CMD = onceq CMD --help for $(wc -w <<<"$cmds") commands; --help silent on stderr"

# --- -b is --brokers --------------------------------------------------------------------------
oq_start_broker
"$ONCEQ_BIN" dlq list -b "$BROKERS" --timeout 10s >"$T/dlq.out" 2>"$T/dlq.err" ||
    oq_fail "dlq list -b: $(cat "$T/dlq.err")"
"$ONCEQ_BIN" dlq list -b"$BROKERS" --timeout 10s >/dev/null 2>"$T/dlq2.err" ||
    oq_fail "dlq list -bHOST:PORT: $(cat "$T/dlq2.err")"
"$ONCEQ_BIN" dlq list -b >/dev/null 2>"$T/nob.err"
[[ $? == 2 ]] && grep -q -- "-b (--brokers) needs a value" "$T/nob.err" ||
    oq_fail "-b without a value: $(cat "$T/nob.err")"
"$ONCEQ_BIN" purge -b "$BROKERS" >/dev/null 2>"$T/purge.err"
[[ $? == 2 ]] && grep -q "unknown option -b" "$T/purge.err" ||
    oq_fail "purge (no --brokers) took -b: $(cat "$T/purge.err")"
"$ONCEQ_BIN" relay --help | grep -q -- "-b VALUE" || oq_fail "relay --help does not list -b"
oq_pass "-b is --brokers (dlq list against the broker), unknown where --brokers is"

# --- completion of the actions ----------------------------------------------------------------
"$ONCEQ_BIN" completion bash >"$T/completion.bash" || oq_fail "completion bash"
BIN_DIR=$(cd "$(dirname "$ONCEQ_BIN")" && pwd)
complete_words() { # complete_words WORD...: the completions of the last word, sorted
    PATH=$BIN_DIR:$PATH bash -c '
        source "$1" || exit 9
        shift
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        _onceq
        printf "%s\n" "${COMPREPLY[@]}"' _ "$T/completion.bash" "$@" | sort | tr '\n' ' '
}
want() { # want "EXPECTED" WORD...
    local exp=$1 got
    shift
    got=$(complete_words "$@")
    [[ $got == "$exp" ]] || oq_fail "completion of '$*': got '$got', want '$exp'"
}
want "list resolve show " onceq review ''
want "redrive " onceq dlq re
want "list redrive show " onceq dlq ''
want "create delete describe " onceq topics ''
want "call canon " onceq help ca
want "completion " onceq comp
out=$(complete_words onceq review list --j)
[[ $out == "--json " ]] || oq_fail "onceq review list --j<TAB>: $out"
out=$(complete_words onceq relay -)
grep -qw -- -b <<<"$out" || oq_fail "onceq relay -<TAB> lacks -b: $out"
oq_pass "completion: actions of review, dlq, topics; help CMD; -b"
