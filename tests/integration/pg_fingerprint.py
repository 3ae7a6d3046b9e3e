#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The SQL fingerprint (onceq.fingerprint / onceq.jcs, schema/postgres/0002_submit.sql) against
the C one, byte for byte: the RFC 8785 vectors of tests/data/jcs, then N random documents
(seeded) given to both sides as the same JSON text: each document must get the same
fingerprint on both sides, or be refused by both.

    pg_fingerprint.py CONNINFO TESTDATA OQ_FP_BATCH [N] [SEED]

Known and documented differences are not generated: duplicate member names (jsonb keeps the
last one, the C parser refuses the text) and integer literals of 1e21 or more (jsonb keeps no
literal form; the C parser refuses them as integer overflow, SQL reads the double).
"""
import json
import math
import os
import random
import subprocess
import sys

import psycopg2
import psycopg2.extras

conninfo, testdata, fp_batch = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
SEED = int(sys.argv[5]) if len(sys.argv) > 5 else 8785

conn = psycopg2.connect(conninfo)
conn.autocommit = True
cur = conn.cursor()

# --- 1. the RFC 8785 vectors -------------------------------------------------------------------
jcs_dir = os.path.join(testdata, "jcs")
bad = 0
names = sorted(os.listdir(os.path.join(jcs_dir, "input")))
for name in names:
    base = name[:-5]
    text = open(os.path.join(jcs_dir, "input", name), "rb").read().decode("utf-8")
    out_path = os.path.join(jcs_dir, "output", name)
    if os.path.exists(out_path):
        want = open(out_path, "rb").read()
    else:
        want = bytes.fromhex(open(os.path.join(jcs_dir, "outhex", base + ".txt")).read().replace(" ", "").replace("\n", ""))
    cur.execute("SELECT onceq.jcs(%s::jsonb)", (text,))
    got = cur.fetchone()[0].encode("utf-8")
    if got != want:
        bad += 1
        print("VECTOR MISMATCH %s\n  want %r\n  got  %r" % (name, want, got))
print("RFC 8785 vectors: %d of %d equal" % (len(names) - bad, len(names)))
if bad:
    sys.exit(1)

# --- 2. random documents ---------------------------------------------------------------------
rnd = random.Random(SEED)
CHARS = (list("abcxyzAZ019 _-/") + ["\u20ac", "\u00f6", "\u0080", "\ufb33", "\ue000", "\uffee",
         "\U0001f602", "\U00010000", "\n", "\t", "\x01", "\x1f", "\x7f", '"', "\\", "\u2028", "é"])


def rstr(maxlen):
    return "".join(rnd.choice(CHARS) for _ in range(rnd.randint(0, maxlen)))


def rnum():
    r = rnd.random()
    if r < 0.25:
        return str(rnd.randint(-2**53, 2**53))
    if r < 0.30:
        return rnd.choice(["9007199254740992", "-9007199254740992", "9007199254740993",
                           "-9007199254740993", "18446744073709551616", "123456789012345678",
                           "0", "-0", "0.0", "-0.0", "1e21", "1E21", "1e20", "1e16", "4.50",
                           "100.0", "2e-3", "1e-7", "1e-6", "0.000001", "5e-324", "1e-400",
                           "1e400", "-1e400", "1.7976931348623157e308", "2.2250738585072014e-308",
                           "333333333.33333329", "1E30", "0.1", "1e-27", "123e-2"])
    if r < 0.55:
        x = rnd.uniform(-1, 1) * 10 ** rnd.randint(-30, 30)
        return repr(x)
    if r < 0.70:
        x = rnd.uniform(-1, 1) * 10 ** rnd.randint(-320, 308)
        return repr(x) if math.isfinite(x) else "1"
    if r < 0.80:
        x = rnd.uniform(-1e6, 1e6)
        return rnd.choice(["%.3f", "%.17g", "%e", "%.2E", "%g"]) % x
    if r < 0.90:
        # a double's exact bits, written with 17 significant digits
        x = rnd.getrandbits(64)
        import struct
        d = struct.unpack("<d", struct.pack("<Q", x))[0]
        return "%.17g" % d if math.isfinite(d) else "0"
    return str(rnd.randint(-1000, 1000)) + "." + str(rnd.randint(0, 99999))


def rval(depth):
    r = rnd.random()
    if depth < 5 and r < 0.15:
        return robj(depth + 1)
    if depth < 5 and r < 0.25:
        return "[" + ",".join(rval(depth + 1) for _ in range(rnd.randint(0, 4))) + "]"
    if r < 0.50:
        return json.dumps(rstr(6), ensure_ascii=rnd.random() < 0.5)
    if r < 0.85:
        return rnum()
    return rnd.choice(["true", "false", "null"])


def robj(depth):
    keys = set()
    parts = []
    for _ in range(rnd.randint(0, 6)):
        k = rstr(4)
        if k in keys:
            continue
        keys.add(k)
        sep = rnd.choice([":", " : ", ":"])
        parts.append(json.dumps(k, ensure_ascii=rnd.random() < 0.5) + sep + rval(depth))
    return "{" + rnd.choice([",", ", "]).join(parts) + "}"


def special():
    r = rnd.randint(0, 5)
    if r == 0:
        n = rnd.choice([62, 63, 64, 65, 66])  # nesting around the 64-level limit
        return "{\"a\":" + "[" * (n - 1) + "1" + "]" * (n - 1) + "}"
    if r == 1:
        return '{"s":"\\ud800"}'  # a lone surrogate
    if r == 2:
        return '{"s":"a\\u0000b"}'  # NUL
    if r == 3:
        return '{"s":"\\ud83d\\ude02","\\ud83d\\ude02":1,"\\ue000":2}'
    if r == 4:
        return '{"n":[1e-400,1]}'
    return '{"x":' + rnum() + '}'


docs = []
for i in range(N):
    docs.append(special() if rnd.random() < 0.02 else robj(1))

c_out = subprocess.run([fp_batch, "default", "t"], input="\n".join(docs) + "\n",
                       capture_output=True, text=True, check=True).stdout.splitlines()
assert len(c_out) == N, (len(c_out), N)

cur.execute("""CREATE OR REPLACE FUNCTION pg_temp.fp(t text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN onceq.fingerprint('default', 't', t::jsonb);
EXCEPTION WHEN others THEN
    RETURN 'ERR ' || SQLSTATE;
END $$""")
cur.execute("CREATE TEMP TABLE docs(id int PRIMARY KEY, doc text)")
psycopg2.extras.execute_values(cur, "INSERT INTO docs VALUES %s", list(enumerate(docs)),
                               page_size=1000)
cur.execute("SELECT id, pg_temp.fp(doc) FROM docs ORDER BY id")
pg_out = [r[1] for r in cur.fetchall()]

mismatch = 0
both_refused = 0
for i, (c, p) in enumerate(zip(c_out, pg_out)):
    c_err, p_err = c.startswith("ERR"), p.startswith("ERR")
    if c_err and p_err:
        both_refused += 1
        continue
    if c != p:
        mismatch += 1
        if mismatch <= 10:
            print("MISMATCH doc %d: C %s  SQL %s\n  %s" % (i, c, p, docs[i][:300]))
print("random documents: %d, equal fingerprints %d, refused by both %d, mismatches %d (seed %d)"
      % (N, N - mismatch - both_refused, both_refused, mismatch, SEED))
sys.exit(1 if mismatch else 0)
