#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tools-file secrets and mutual TLS, end to end through the HTTP tool executor
# (consumer/http_tools.c via tests/tools/oq_http_exec_cli) against a Python https server that
# requires a client certificate signed by a test CA (all made here with openssl):
#   - ca_file + client_cert + client_key: the handshake succeeds, the call is SUCCESS, and the
#     headers from {"env"}, {"file"} and a template reach the server;
#   - no client certificate, or no ca_file (the system's CAs do not know the test CA): no
#     request reaches the server, never SUCCESS;
#   - load errors name the tool and the field or header: a missing TLS file, a key without its
#     certificate, TLS on an http:// URL, an unset variable, a missing secret file; the secret
#     value is never printed.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
CLI=$(oq_tool oq_http_exec_cli)
[[ -x "$CLI" ]] || oq_fail "missing $CLI"
if ! command -v openssl >/dev/null; then
    [[ "${CI:-}" == true ]] && oq_fail "openssl is required (apt-get install openssl)"
    echo "SKIP: needs openssl for the test certificates"
    exit 77
fi

# --- a CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it -----
ssl() { openssl "$@" >>"$T/openssl.log" 2>&1 || oq_fail "openssl $1 failed: $(tail -3 "$T/openssl.log")"; }
ssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=onceq-test-ca -keyout "$T/ca.key" \
    -out "$T/ca.pem"
for who in server client; do
    ssl req -newkey rsa:2048 -nodes -subj "/CN=onceq-test-$who" -keyout "$T/$who.key" \
        -out "$T/$who.csr"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$T/$who.ext"
    ssl x509 -req -in "$T/$who.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial -days 2 \
        -extfile "$T/$who.ext" -out "$T/$who.pem"
done

# --- the server: TLS, client certificate required; logs each request's headers as JSON --------
cat >"$T/server.py" <<'PY'
import http.server, json, ssl, sys
T = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        peer = self.connection.getpeercert() or {}
        cn = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
        with open(T + "/requests.jsonl", "a") as f:
            f.write(json.dumps({"headers": dict(self.headers), "client_cn": cn}) + "\n")
        body = b'{"id":"p-1"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(T + "/server.pem", T + "/server.key")
ctx.load_verify_locations(T + "/ca.pem")
ctx.verify_mode = ssl.CERT_REQUIRED
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
with open(T + "/port.tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(T + "/port.tmp", T + "/port")
srv.serve_forever()
PY
oq_spawn tls_server python3 "$T/server.py" "$T"
oq_wait_for 15 test -s "$T/port" || oq_fail "the https server did not start"
PORT=$(cat "$T/port")
URL=https://127.0.0.1:$PORT/v1/payments

SECRET=sk-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$SECRET" >"$T/api.key"
chmod 600 "$T/api.key"
export OQ_TEST_PAY_TOKEN=tok-$SECRET
jq -n --arg u "$URL" --arg t "$T" '{version: 1, tools: [
  {name: "pay_mtls", url: $u, body: {amount: "{amount}"},
   headers: {"Authorization": {env: "OQ_TEST_PAY_TOKEN", prefix: "Bearer "},
             "X-Api-Key": {file: ($t + "/api.key")}, "X-Order": "order-{order}"},
   ca_file: ($t + "/ca.pem"), client_cert: ($t + "/client.pem"), client_key: ($t + "/client.key"),
   timeout_ms: 5000},
  {name: "pay_nocert", url: $u, ca_file: ($t + "/ca.pem"), timeout_ms: 5000},
  {name: "pay_noca", url: $u, client_cert: ($t + "/client.pem"),
   client_key: ($t + "/client.key"), timeout_ms: 5000}]}' >"$T/tools.json"
"$CLI" --tools "$T/tools.json" --check >/dev/null 2>"$T/check.err" ||
    oq_fail "tools file does not load: $(cat "$T/check.err")"
call() { "$CLI" --tools "$T/tools.json" --tool "$1" --args '{"amount":5,"order":42}' \
    --effect-id "e-$1" 2>"$T/$1.err"; }

out=$(call pay_mtls) || oq_fail "pay_mtls: $(cat "$T/pay_mtls.err")"
[[ $(jq -r .class <<<"$out") == SUCCESS && $(jq -r .object_id <<<"$out") == p-1 ]] ||
    oq_fail "mutual TLS call: $out"
[[ $(wc -l <"$T/requests.jsonl") == 1 ]] || oq_fail "requests: $(cat "$T/requests.jsonl")"
req=$(head -1 "$T/requests.jsonl")
[[ $(jq -r '.headers.Authorization' <<<"$req") == "Bearer tok-$SECRET" ]] ||
    oq_fail "Authorization from the environment did not arrive: $req"
[[ $(jq -r '.headers["X-Api-Key"]' <<<"$req") == "$SECRET" ]] ||
    oq_fail "X-Api-Key from the file did not arrive: $req"
[[ $(jq -r '.headers["X-Order"]' <<<"$req") == order-42 ]] || oq_fail "X-Order template: $req"
[[ $(jq -r '.headers["Idempotency-Key"]' <<<"$req") == e-pay_mtls ]] || oq_fail "key: $req"
[[ $(jq -r '.client_cn[0]' <<<"$req") == onceq-test-client ]] || oq_fail "client cert: $req"
oq_pass "mutual TLS: SUCCESS; env, file and template headers reached the server"

for t in pay_nocert pay_noca; do
    out=$(call $t) || oq_fail "$t: $(cat "$T/$t.err")"
    [[ $(jq -r .class <<<"$out") != SUCCESS ]] || oq_fail "$t succeeded: $out"
done
[[ $(wc -l <"$T/requests.jsonl") == 1 ]] ||
    oq_fail "a request got through without a client cert or a trusted CA: $(cat "$T/requests.jsonl")"
oq_pass "no client certificate / no ca_file: refused in the handshake, nothing served"

# --- load errors name the tool and the field or header, never the secret ---------------------
bad() { # bad NEEDLE JQ-EDIT: the tools file edited so; --check must exit 2 naming NEEDLE
    local needle=$1
    jq "$2" "$T/tools.json" >"$T/bad.json" || oq_fail "jq $2"
    "$CLI" --tools "$T/bad.json" --check >/dev/null 2>"$T/bad.err"
    local rc=$?
    [[ $rc == 2 ]] || oq_fail "$2: exit $rc, want 2: $(cat "$T/bad.err")"
    grep -qF -- "$needle" "$T/bad.err" || oq_fail "$2: error lacks '$needle': $(cat "$T/bad.err")"
    grep -qF -- "$SECRET" "$T/bad.err" && oq_fail "the secret was printed: $(cat "$T/bad.err")"
    return 0
}
bad 'tool "pay_mtls" (tools[0]): field client_key: cannot read /nonexistent/k.pem' \
    '.tools[0].client_key = "/nonexistent/k.pem"'
bad 'tool "pay_mtls" (tools[0]): field ca_file: cannot read /nonexistent/ca.pem' \
    '.tools[0].ca_file = "/nonexistent/ca.pem"'
bad 'tool "pay_noca" (tools[2]): field client_key: needs client_cert' 'del(.tools[2].client_cert)'
bad 'field ca_file: TLS settings need an https:// url' '.tools[1].url = "http://127.0.0.1:1/x"'
bad 'tool "pay_mtls" (tools[0]): field headers.Authorization: environment variable NO_SUCH_TOKEN_VAR is not set' \
    '.tools[0].headers.Authorization.env = "NO_SUCH_TOKEN_VAR"'
bad "field headers.X-Api-Key: cannot read file $T/gone.key" \
    ".tools[0].headers[\"X-Api-Key\"].file = \"$T/gone.key\""
printf '%s\nsecond line\n' "$SECRET" >"$T/two.key"
bad "field headers.X-Api-Key: file $T/two.key holds a line break" \
    ".tools[0].headers[\"X-Api-Key\"].file = \"$T/two.key\""
OQ_TEST_PAY_TOKEN="$SECRET"$'\n'"X: y" bad \
    'field headers.Authorization: environment variable OQ_TEST_PAY_TOKEN holds a control character' '.'
oq_pass "load errors: TLS files, key without cert, http:// URL, unset variable, bad secret files"
