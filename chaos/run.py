#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The chaos matrix runner: every fault class as a scenario, each run N times with its timing and
its choices (which process, which crash point, which broker, how long) drawn from one printed
seed, each run checked end to end.

    chaos/run.py [--scenarios a,b|all] [--runs N] [--seed S] [--minutes M] [--out DIR]
                 [--build DIR] [--smoke] [--real-kafka] [--db sqlite|pg] [--list]

Design. One run = one fresh directory, one embedded broker (`onceq broker`), a producer, a relay
and consumers started as separate processes in sessions of their own (setsid), each killed by its
pid (TERM, then KILL after 5 s, then KILL to its own process group); every wait is bounded. A
scenario drives load and faults, then the run drains (every accepted call terminal, dead
processes restarted), stops everything and checks: `onceq verify --accepted` (one call per key,
at most one effect per call, no effect for a conflicting body, nothing accepted lost, nothing
re-executed), `PRAGMA integrity_check` on every database, the scenario's own checks (status codes,
per-logical-request effects), and that every restarted process stayed up. A run's random choices
come from random.Random("<seed>:<scenario>:<run>"), so `--seed S --scenarios X --runs K`
replays the same choices for runs 1..K of X whatever else is selected (the machine's own
scheduling is not replayed: the same choices, not the same interleaving).

The real-Kafka row (kafka_node_faults, only with --real-kafka) runs the same processes against
one 3-node KRaft cluster (scripts/kafka-cluster.sh) started for all its runs in
<results>/kafka and stopped by pid when they end (also on a failure, Ctrl-C or TERM); each
run recreates the onceq topics. Without java, kcat or the Kafka jars it is reported as skipped
(exit 77 when nothing failed), never as passed.

PostgreSQL (--db pg): every run gets a fresh database on one server (--pg-url, else
ONCEQ_TEST_PG_URL, else a private cluster started with scripts/pg.sh in <results>/pg and stopped
at the end); producer, relay and consumers (--pg-stages chooses) keep their state there instead
of calls.db and effects.db, the checks read it with psql, and `onceq
verify` reads it through its snapshots. Rows that exercise SQLite itself (its write lock, its
files' disk, rows deleted under its relay) are reported as skipped on PostgreSQL.

Recovery time = the last fault injected (kill, stop, broker error, lock, proxy fault) to the
moment every call in calls.db is terminal, after the load ended; sampled every 100 ms.

Report: one table per invocation (printed, results/<stamp>/report.md + report.json) and a chart
of recovery times (recovery.svg, drawn by hand). Exit 0 when every run of every scenario passed,
1 otherwise, 77 when none failed but a selected scenario was skipped, 2 on bad usage.
"""
import argparse
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CRASH_POINTS = {  # named in producer/writer.c, relay/oq_relay.h, consumer/oq_consumer.h
    "producer": ["producer.after_commit_before_reply"],
    "relay": ["relay.after_lease_acquire", "relay.after_read_batch",
              "relay.after_produce_before_delivery", "relay.after_delivery_before_mark",
              "relay.after_mark_before_commit", "relay.after_mark_commit"],
    "consumer": ["consumer.after_intake_before_commit", "consumer.after_claim",
                 "consumer.in_tool", "consumer.after_effect_before_commit",
                 "consumer.after_commit_before_offset"],
}
FAST_TIMEOUT = ["-X", "socket.timeout.ms=1000", "-X", "request.timeout.ms=1000"]


class RunFailed(Exception):
    pass


class PgError(Exception):
    pass


DB_ERRORS = (sqlite3.Error, PgError)
# the consumer's tables in schema onceq are consumer_<its SQLite name> (schema/postgres/0003)
PG_CONSUMER_TABLES = re.compile(r"\b(inbox|executions|effects|audit|dlq|retention)\b")
PG_SKIP = {  # rows that exercise SQLite itself: skipped with --db pg
    "busy_storm": "holds SQLite's write lock on calls.db/effects.db",
    "lost_messages": "deletes rows of the SQLite outboxes under their relays",
    "disk_full": "fills a small filesystem under the SQLite files",
}


def is_pg(db):
    return isinstance(db, str) and db.startswith(("postgres://", "postgresql://"))


def pg_query(url, sql, args=(), consumer=False):
    """Rows of one statement on PostgreSQL through psql (schema onceq first in search_path);
    '?' placeholders are replaced by quoted literals. Integers come back as int, NULL as None."""
    if consumer:
        sql = PG_CONSUMER_TABLES.sub(r"consumer_\1", sql)
    lit = lambda v: "NULL" if v is None else str(v) if isinstance(v, (int, float)) else \
        "'" + str(v).replace("'", "''") + "'"
    pos = iter(range(len(args) + 1))  # '?' takes the next argument, '?N' the N-th

    def arg(m):
        i = int(m.group(1)) - 1 if m.group(1) else next(pos)
        if i >= len(args):
            raise PgError(f"{len(args)} arguments, placeholder {i + 1}: {sql}")
        return lit(args[i])
    sql = re.sub(r"\?(\d*)", arg, sql)
    env = dict(os.environ, PGOPTIONS="-c search_path=onceq,public", PGCONNECT_TIMEOUT="10")
    try:
        r = subprocess.run(["psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-F", "\x1f", "-d", url,
                            "-c", sql], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        raise PgError(f"psql timed out: {sql[:200]}")
    if r.returncode != 0:
        raise PgError(f"psql: {r.stderr.strip()[:300]} ({sql[:200]})")
    conv = lambda v: None if v == "" else int(v) if re.fullmatch(r"-?\d+", v) else v
    return [tuple(conv(v) for v in line.split("\x1f")) for line in r.stdout.splitlines()]


class PgServer:
    """The PostgreSQL server of --db pg: --pg-url, else ONCEQ_TEST_PG_URL, else a private cluster
    (scripts/pg.sh) in <out>/pg, stopped by stop(). fresh(name) makes an empty database."""

    def __init__(self, opts):
        self.url = opts.pg_url or os.environ.get("ONCEQ_TEST_PG_URL")
        self.dir = None
        if not self.url:
            self.dir = os.path.join(opts.out, "pg")
            os.makedirs(self.dir, exist_ok=True)
            os.chmod(opts.out, 0o711)  # the server's unprivileged owner must reach its folder
            r = subprocess.run(["bash", os.path.join(SRC, "scripts/pg.sh"), "start", "--dir",
                                self.dir], capture_output=True, text=True, timeout=180)
            if r.returncode != 0:
                raise RuntimeError(f"scripts/pg.sh start: {r.stderr.strip()[-400:]}")
            self.url = subprocess.run(["bash", os.path.join(SRC, "scripts/pg.sh"), "url", "--dir",
                                       self.dir], capture_output=True, text=True,
                                      check=True).stdout.strip()

    def fresh(self, name):
        pg_query(self.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        pg_query(self.url, f"CREATE DATABASE {name}")
        return re.sub(r"^(postgres(?:ql)?://[^/]*/)[^?]*", lambda m: m.group(1) + name, self.url)

    def drop(self, name):
        try:
            pg_query(self.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except PgError:
            pass

    def stop(self):
        if self.dir:
            subprocess.run(["bash", os.path.join(SRC, "scripts/pg.sh"), "stop", "--dir", self.dir],
                           capture_output=True, timeout=60)


def now():
    return time.monotonic()


def free_port():
    """A loopback port below the ephemeral range, free at the time of asking (not seeded)."""
    sysrng = random.SystemRandom()
    for _ in range(200):
        p = sysrng.randrange(10000, 32000)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
        finally:
            s.close()
    raise RunFailed("no free port")


def pct(values, p):
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


class Run:
    """One run of one scenario: its processes, its directory, its measurements."""

    kafka_profile = "mock"  # "real" once run.brokers names a real cluster

    def __init__(self, opts, scenario, idx, seed):
        self.opts = opts
        self.name = scenario
        self.idx = idx
        self.seed_str = f"{seed}:{scenario}:{idx}"
        self.rng = random.Random(self.seed_str)
        self.dir = os.path.join(opts.out, "runs", f"{scenario}-{idx}")
        os.makedirs(self.dir, exist_ok=True)
        self.bin = os.path.join(opts.build, "onceq")
        self.procs = {}  # name -> Popen
        self.specs = {}  # name -> (argv, env) for restarts
        self.supervised = set()
        self.armed = {}  # name -> crash point armed at its last start
        self.restarts = []  # (name, time)
        self.fired = []
        self.failures = []
        self.notes = []
        self.t_fault = None
        self.metrics = {}
        self.pdb = os.path.join(self.dir, "calls.db")
        self.cdb = os.path.join(self.dir, "effects.db")
        self.pg_name = None
        if opts.db == "pg":  # a fresh database per run; the consumers' string differs only by
            # application_name, so q() knows which stage's audit table a query means
            self.pg_name = re.sub(r"[^a-z0-9_]", "_", f"oqc_{scenario}_{idx}".lower())[:60]
            url = opts.pg.fresh(self.pg_name)
            subprocess.run([os.path.join(opts.build, "onceq"), "migrate", "--db", url],
                           check=True, capture_output=True, timeout=60)
            self.pdb = url
            if "consumer" in opts.pg_stages:
                self.cdb = url + ("&" if "?" in url else "?") + "application_name=onceq-consumer"
        self.accepted = os.path.join(self.dir, "accepted")
        open(self.accepted, "w").close()
        self.port = None
        self.brokers = None
        self.ctl = None
        self.cleanups = []  # run after every process stopped (unmounts)
        self.ddb = None  # the downstream's ledger, when the run has one
        self.dport = None
        self.brk = opts.brk  # a protection broken on purpose (--break): the run must fail
        self.group = "onceq-workers"  # the consumers' group
        self.log = open(os.path.join(self.dir, "run.log"), "a")

    # --- bookkeeping ---------------------------------------------------------------------------
    def say(self, msg):
        line = f"[{time.strftime('%H:%M:%S')}] {self.name}#{self.idx}: {msg}"
        self.log.write(line + "\n")
        self.log.flush()
        if self.opts.verbose:
            print(line, flush=True)

    def fault(self, what):
        self.t_fault = now()
        self.say(f"FAULT {what}")

    def fail(self, msg):
        self.failures.append(msg)
        self.say(f"FAIL {msg}")

    def note(self, msg):
        self.notes.append(msg)
        self.say(f"note {msg}")

    def tool(self, name):
        return os.path.join(self.opts.build, name)

    # --- processes -----------------------------------------------------------------------------
    def spawn(self, name, argv, env=None, supervise=True):
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            raise RunFailed(f"spawn {name}: already running (pid {p.pid})")
        e = dict(os.environ)
        e.pop("ONCEQ_CRASH_AT", None)
        e.setdefault("ONCEQ_LOG_LEVEL", "warn")
        # the client defaults of the brokers in use (kafka-profile, common/kafka.c)
        e["ONCEQ_KAFKA_PROFILE"] = self.kafka_profile
        if env:
            e.update(env)
        out = open(os.path.join(self.dir, f"{name}.log"), "ab")
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, env=e,
                                            start_new_session=True)
        out.close()
        self.specs[name] = (argv, env)
        self.armed[name] = (env or {}).get("ONCEQ_CRASH_AT")
        if supervise:
            self.supervised.add(name)
        self.say(f"spawned {name} pid={self.procs[name].pid}"
                 + (f" armed={self.armed[name]}" if self.armed[name] else ""))
        return self.procs[name]

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def send(self, name, sig):
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)

    def stop(self, name, sig=signal.SIGTERM, timeout=5.0):
        """Signal by pid, wait bounded, KILL if needed, then KILL its own process group."""
        p = self.procs.get(name)
        if p is None:
            return None
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.say(f"{name} pid={p.pid} ignored {sig} for {timeout}s: KILL")
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the session started with it (pgid == its pid)
        except (ProcessLookupError, PermissionError):
            pass
        return p.returncode

    def stop_all(self):
        order = [n for n in self.procs if n != "broker"] + (["broker"] if "broker" in self.procs
                                                            else [])
        for n in order:
            self.stop(n)

    def restart(self, name, env=None):
        argv, old_env = self.specs[name]
        self.spawn(name, argv, env, supervise=True)
        self.restarts.append((name, now()))

    def supervise(self):
        """Restart supervised processes that died; record armed crash points that fired."""
        for name in sorted(self.supervised):
            p = self.procs[name]
            if p.poll() is None:
                continue
            rc = p.returncode
            armed = self.armed.get(name)
            if rc == -signal.SIGKILL and getattr(p, "oq_killed", False):
                pass  # killed by the scenario (kill9 recorded the fault)
            elif rc == -signal.SIGKILL and armed:
                self.fired.append(armed)
                self.fault(f"{name} died at crash point {armed}")
            else:
                # a restart that died again on its own within seconds: will not restart
                recent = [t for (n, t) in self.restarts if n == name and now() - t < 10]
                if recent:
                    self.fail(f"{name} exited rc={rc} within 10 s of its restart")
                    self.supervised.discard(name)
                    continue
                self.note(f"{name} exited rc={rc} unarmed")
            self.stop(name)
            self.restart(name)
            if name == "producer":
                self.wait_healthy(30)

    def kill9(self, name):
        p = self.procs[name]
        if p.poll() is None:
            p.oq_killed = True
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
            self.fault(f"kill -9 {name}")

    # --- pipeline ------------------------------------------------------------------------------
    def start_broker(self, extra=()):
        boot = os.path.join(self.dir, "bootstrap")
        self.spawn("broker", [self.bin, "broker", "--bootstrap-file", boot, *extra],
                   supervise=False)
        self.ctl = boot + ".ctl"
        self.wait(15, lambda: os.path.getsize(boot) > 0 and os.path.exists(self.ctl),
                  "broker bootstrap file")
        with open(boot) as f:
            self.brokers = f.read().strip()

    def broker_ctl(self, cmd, timeout=10):
        log = self.ctl + ".log"
        before = 0
        if os.path.exists(log):
            with open(log) as f:
                before = len(f.readlines())
        deadline = now() + 5
        while True:  # a FIFO without a reader: O_NONBLOCK fails with ENXIO; retry bounded
            try:
                fd = os.open(self.ctl, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if now() > deadline:
                    raise RunFailed(f"broker control FIFO not writable for '{cmd}'")
                time.sleep(0.05)
        try:
            os.write(fd, (cmd + "\n").encode())
        finally:
            os.close(fd)
        deadline = now() + timeout
        while now() < deadline:
            if os.path.exists(log):
                with open(log) as f:
                    lines = f.readlines()
                if len(lines) > before:
                    line = lines[before].strip()
                    self.say(f"broker ctl '{cmd}': {line}")
                    if not line.startswith("ok"):
                        raise RunFailed(f"broker ctl '{cmd}': {line}")
                    return line
            time.sleep(0.05)
        raise RunFailed(f"broker ctl '{cmd}': no ack in {timeout}s")

    def start_producer(self, env=None, extra=()):
        self.spawn("producer", [self.bin, "producer", "--db", self.pdb, "--listen",
                                f"127.0.0.1:{self.port}", "--brokers", self.brokers,
                                "-X", "session.timeout.ms=6000", *extra], env)

    def start_relay(self, env=None, extra=()):
        self.spawn("relay", [self.bin, "relay", "--db", self.pdb, "--brokers", self.brokers,
                             "--lease", "1s", *extra], env)

    def start_consumer(self, i, env=None, extra=()):
        self.spawn(f"consumer-{i}", [self.bin, "consumer", "--db", self.cdb, "--group",
                                     self.group, "--brokers", self.brokers, "--worker-id",
                                     f"consumer-{i}", "-X", "session.timeout.ms=6000",
                                     "--lease", "3s", *extra], env)

    def start_pipeline(self, consumers=2, relay_x=(), consumer_x=(), envs=None):
        envs = envs or {}
        self.port = free_port()
        self.start_broker()
        self.start_producer(envs.get("producer"))
        self.start_relay(envs.get("relay"), relay_x)
        for i in range(1, consumers + 1):
            self.start_consumer(i, envs.get(f"consumer-{i}"), consumer_x)
        self.wait_healthy(30)
        self.wait(30, lambda: self.db_exists(self.cdb), "consumer database", supervise=True)

    def healthy(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            c.request("GET", "/healthz")
            ok = c.getresponse().status == 200
            c.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False

    def wait_healthy(self, timeout):
        self.wait(timeout, self.healthy, "producer /healthz")

    def wait(self, timeout, pred, what, supervise=False):
        deadline = now() + timeout
        while now() < deadline:
            if supervise:
                self.supervise()
            try:
                if pred():
                    return
            except (OSError,) + DB_ERRORS:
                pass
            time.sleep(0.1)
        raise RunFailed(f"timed out after {timeout}s waiting for {what}")

    # --- load ----------------------------------------------------------------------------------
    def load(self, calls, rate, prefix, conns=4, mix=None, sleep_ms=5, extra=()):
        argv = [self.tool("oq_e2e_load"), "--port", str(self.port), "--calls", str(calls),
                "--rate", str(rate), "--conns", str(conns), "--prefix", f"{prefix}{self.idx}",
                "--sleep-ms", str(sleep_ms), "--accepted", self.accepted, "--retry-ms", "120000",
                *extra]
        if mix:
            argv += ["--mix", mix]
        return self.spawn("load", argv, supervise=False)

    def wait_load(self, timeout=240):
        p = self.procs["load"]
        deadline = now() + timeout
        while p.poll() is None and now() < deadline:
            self.supervise()
            time.sleep(0.1)
        if p.poll() is None:
            self.stop("load")
            raise RunFailed(f"load still running after {timeout}s")
        with open(os.path.join(self.dir, "load.log")) as f:
            out = dict(l.strip().split("=", 1) for l in f if "=" in l and " " not in l.strip())
        if p.returncode != 0:
            self.fail(f"load exit {p.returncode}")
        return out

    # --- checks --------------------------------------------------------------------------------
    def db_exists(self, db):
        return is_pg(db) or (os.path.exists(db) and os.path.getsize(db) > 0)

    def q(self, db, sql, args=()):
        if is_pg(db):
            return pg_query(db, sql, args, consumer=(db == self.cdb))
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return c.execute(sql, args).fetchall()
        finally:
            c.close()

    def pending(self):
        return self.q(self.pdb, "SELECT count(*) FROM calls WHERE state IN "
                                "('pending','running')")[0][0]

    def drain(self, timeout=240):
        """Every call terminal, supervising meanwhile; sets the recovery time."""
        deadline = now() + timeout
        last_log = 0
        while now() < deadline:
            self.supervise()
            try:
                n = self.pending()
            except DB_ERRORS:
                n = -1
            if n == 0:
                t = now()
                if self.t_fault is not None:
                    self.metrics["recovery_ms"] = round((t - self.t_fault) * 1000)
                self.say(f"drained (recovery {self.metrics.get('recovery_ms')} ms)")
                return
            if now() - last_log > 10:
                self.say(f"draining: pending={n}")
                last_log = now()
            time.sleep(0.1)
        raise RunFailed(f"not drained within {timeout}s: pending={self.pending()}")

    def verify(self, expect_rc=0):
        argv = [self.bin, "verify", "--producer-db", self.pdb, "--consumer-db", self.cdb,
                "--json", "--accepted", self.accepted, "--examples", "5"]
        if self.ddb:
            argv += ["--downstream-db", self.ddb]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        with open(os.path.join(self.dir, "verify.json"), "w") as f:
            f.write(r.stdout)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            raise RunFailed(f"verify exit {r.returncode}, no JSON: {r.stderr[-500:]}")
        self.metrics["verify_rc"] = r.returncode
        if r.returncode != expect_rc:
            self.fail(f"onceq verify exit {r.returncode} (expected {expect_rc}): "
                      f"{r.stdout[:800]}")
        return j

    def integrity(self):
        for db in (self.pdb, self.cdb, self.ddb):
            if db is None or is_pg(db):  # PostgreSQL checks its own pages (and WAL)
                continue
            if not os.path.exists(db):
                continue
            c = sqlite3.connect(db, timeout=30)
            try:
                res = c.execute("PRAGMA integrity_check").fetchall()
            finally:
                c.close()
            if res != [("ok",)]:
                self.fail(f"integrity_check {os.path.basename(db)}: {res[:5]}")

    def finish(self, verify_rc=0):
        """Drained already: stop everything, then the end-to-end checks; fill the metrics.
        With a downstream (self.ddb) verify reads its ledger too; verify_rc is the exit
        expected (3 for a negative control whose ledger must show duplicates)."""
        for name in sorted(self.supervised):
            if not self.alive(name):
                self.fail(f"{name} not running at the end")
        self.stop_all()
        j = self.verify(verify_rc)
        self.integrity()
        m = self.metrics
        m["calls"] = j.get("calls", 0)
        m["effects"] = j.get("effects", 0)
        m["inbox_duplicates"] = j.get("inbox_duplicates", 0)
        m["duplicate_effects"] = j.get("duplicates", 0)
        m["lost"] = j.get("lost", 0) + j.get("by_kind", {}).get("accepted_missing", 0)
        m["fired"] = list(self.fired)
        if self.ddb:
            m["downstream_dups"] = j.get("by_kind", {}).get("downstream_dup", 0)
            m["downstream"] = j.get("downstream")
            if verify_rc == 0 and m["downstream_dups"]:
                self.fail(f"duplicate effects in the downstream's ledger: "
                          f"{m['downstream_dups']}")
        if m["duplicate_effects"]:
            self.fail(f"duplicate effects: {m['duplicate_effects']}")
        if m["lost"]:
            self.fail(f"lost accepted calls: {m['lost']}")
        if (not self.ddb and j.get("expected_effects") is not None
                and j.get("effects") != j.get("expected_effects")):
            self.fail(f"effects {j.get('effects')} != expected {j.get('expected_effects')}")


# --- HTTP clients ----------------------------------------------------------------------------
def http_post(port, key, body, timeout=5.0):
    """One attempt; returns (status, json or None). Raises OSError/HTTPException on transport."""
    return http_json(port, "POST", "/v1/tool-calls", body, timeout,
                     headers={"Idempotency-Key": key})


def logical_effects(run, client_id):
    """Effects per logical request (calls.seq) of one client: {seq: effects}. Joined here, not in
    SQL: the two stages may live in two databases of two backends."""
    calls = run.q(run.pdb, "SELECT seq, call_id FROM calls WHERE client_id = ?", (client_id,))
    effects = {r[0] for r in run.q(run.cdb, "SELECT call_id FROM effects")}
    per = {}
    for seq, cid in calls:
        per[seq] = per.get(seq, 0) + (1 if cid in effects else 0)
    return per


# --- scenarios -------------------------------------------------------------------------------
def sc_same_key(run):
    """50 clients submit one key at once (one call, one effect); 50 clients submit another key
    with 50 different bodies at once (exactly one 2xx, 49 x 422, the winner's body executed)."""
    n = 20 if run.opts.smoke else 50
    run.start_pipeline(consumers=2)
    for phase in ("same", "diff"):
        key = f"hot-{phase}-{run.idx}"
        amounts = [777] * n if phase == "same" else [1000 + i for i in range(n)]
        results = [None] * n
        barrier = threading.Barrier(n)

        def client(i):
            body = {"tool": "charge", "args": {"amount": amounts[i]}}
            barrier.wait(10)
            for _attempt in range(50):
                try:
                    st, j = http_post(run.port, key, body)
                except (OSError, http.client.HTTPException):
                    time.sleep(0.1)
                    continue
                if st == 503:
                    time.sleep(0.1)
                    continue
                results[i] = (st, j)
                return

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        run.fault(f"{n} concurrent submits of one key ({phase} body)")
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if any(r is None for r in results):
            run.fail(f"{phase}: {sum(r is None for r in results)} clients got no answer")
            continue
        ok = [r for r in results if r[0] in (200, 202)]
        ids = {r[1]["call_id"] for r in ok}
        with open(run.accepted, "a") as f:
            for cid in ids:
                f.write(cid + "\n")
        codes = sorted({r[0] for r in results})
        if phase == "same":
            if len(ok) != n or len(ids) != 1:
                run.fail(f"same body: {len(ok)}/{n} 2xx, {len(ids)} call ids (codes {codes})")
        else:
            c422 = sum(1 for r in results if r[0] == 422)
            if len(ok) != 1 or c422 != n - 1:
                run.fail(f"different bodies: {len(ok)} 2xx and {c422} x 422 of {n}")
            run.metrics["winner_amount"] = ok[0][1]["args"]["amount"] if ok else None
        run.say(f"{phase}: codes {codes}, call ids {len(ids)}")
    run.drain(60)
    calls = run.q(run.pdb, "SELECT idem_key, count(*) FROM calls GROUP BY idem_key")
    for key, cnt in calls:
        if cnt != 1:
            run.fail(f"key {key}: {cnt} calls")
    eff = run.q(run.cdb, "SELECT amount FROM effects")
    if len(eff) != 2:
        run.fail(f"{len(eff)} effects for 2 keys")
    w = run.metrics.get("winner_amount")
    if w is not None and (w,) not in eff:
        run.fail(f"the executed body is not the accepted one (winner amount {w}, effects {eff})")
    run.finish()


def proxy_clients(run, neg):
    """Logical requests through the chaos proxy; retries with the same key (or, for the negative
    control, a new key on every retry). Returns the number of logical requests."""
    n = 30 if run.opts.smoke else 80
    # The negative control must meet a fault that loses an accepted call's answer (drop-response
    # or a delay past the client's timeout: about half the faults) at least once. At 30
    # requests and a rate of 0.25 it met none in about 2 % of runs (a CI run of 2026-12-03 did
    # not): 60 requests at 0.5-0.6 leave about 1e-8.
    lo, hi = (0.5, 0.6) if neg else (0.25, 0.5)
    if neg:
        n *= 2
    pport = free_port()
    modes = "drop-response,duplicate-request,delay,reset"
    run.spawn("proxy", [sys.executable, os.path.join(SRC, "tests/tools/oq_chaos_proxy.py"),
                        "--listen", str(pport), "--upstream", str(run.port), "--modes", modes,
                        "--rate", str(round(run.rng.uniform(lo, hi), 2)), "--delay-ms",
                        "1500", "--seed", str(run.rng.randrange(1 << 30))], supervise=False)
    run.wait(10, lambda: socket.create_connection(("127.0.0.1", pport), 1).close() or True,
             "proxy listening")
    client_id = f"{'neg' if neg else 'pos'}-{run.idx}"
    lock = threading.Lock()
    todo = list(range(n))
    give_up = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {"tool": "charge", "args": {"amount": 500 + i}, "client_id": client_id,
                    "seq": i}
            for attempt in range(40):
                key = f"{client_id}-{i}" + (f"-r{attempt}" if neg else "")
                try:
                    st, j = http_post(pport, key, body, timeout=1.0)
                except (OSError, http.client.HTTPException):
                    time.sleep(0.05)
                    continue
                if st in (200, 202):
                    with lock, open(run.accepted, "a") as f:
                        f.write(j["call_id"] + "\n")
                    break
                if st >= 500 or st == 429:
                    time.sleep(0.1)
                    continue
                with lock:
                    give_up.append((i, st))
                break
            else:
                with lock:
                    give_up.append((i, "retries exhausted"))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    run.stop("proxy")
    with open(os.path.join(run.dir, "proxy.log")) as f:
        text = f.read()
    faults = sum(1 for line in text.splitlines() if line.startswith("fault "))
    run.metrics["proxy_faults"] = faults
    if faults:
        run.t_fault = now()  # the client's last retry ended the faults; measured from here
    if give_up:
        run.fail(f"requests not accepted: {give_up[:5]}")
    run.drain(120)
    per = logical_effects(run, client_id)
    logical = len(per)
    effects = sum(per.values())
    dup = sum(v - 1 for v in per.values() if v > 1)
    run.metrics["logical_requests"] = n
    run.metrics["logical_dup_effects"] = dup
    run.say(f"proxy faults {faults}, logical {logical}/{n}, effects {effects}, logical dups {dup}")
    if logical != n:
        run.fail(f"{n - logical} logical requests have no call")
    missing = [s for s, v in per.items() if v == 0]
    if missing:
        run.fail(f"logical requests without an effect: {missing[:5]}")
    if neg:
        if dup == 0:
            run.fail("negative control: a client changing keys on retry produced no duplicate "
                     f"effect (proxy faults {faults}): the checker would not see duplicates")
    elif dup:
        run.fail(f"{dup} duplicate effects per logical request")


def sc_http_proxy(run):
    """HTTP faults between client and producer (drop-response, duplicate-request, delay past the
    1 s client timeout, reset mid-request); the client retries with the same key."""
    run.start_pipeline(consumers=2)
    proxy_clients(run, neg=False)
    run.finish()


def sc_http_proxy_negative(run):
    """Negative control: the same faults, a client that changes the key on each retry. Must show
    duplicate effects per logical request (> 0), or the checker is blind."""
    run.start_pipeline(consumers=2)
    proxy_clients(run, neg=True)
    run.finish()
    # the pipeline itself did nothing wrong: one effect per call_id; the duplicates are logical
    run.metrics["duplicate_effects_logical"] = run.metrics.get("logical_dup_effects", 0)


def sc_crash_points(run):
    """kill -9 at random named crash points (producer, relay, consumers) and at random moments,
    under load; restart; drain."""
    calls = 150 if run.opts.smoke else 400
    envs = {}
    armed = []
    for _ in range(run.rng.randint(2, 3)):
        proc = run.rng.choice(["producer", "relay", "consumer-1", "consumer-2"])
        if proc in envs:
            continue
        kind = proc.split("-")[0]
        point = run.rng.choice(CRASH_POINTS[kind])
        n = run.rng.randint(1, 40) if kind == "producer" else run.rng.randint(1, 6)
        if point == "relay.after_lease_acquire":
            n = 1
        envs[proc] = {"ONCEQ_CRASH_AT": f"{point}@{n}"}
        armed.append(f"{proc}:{point}@{n}")
    run.say(f"armed {armed}")
    run.start_pipeline(consumers=2, envs=envs)
    run.load(calls, 150, "cp", sleep_ms=5, mix=None, extra=("--dup-every", "25"))
    random_kills = run.rng.randint(1, 2)
    t0 = now()
    times = sorted(run.rng.uniform(0.5, calls / 150.0) for _ in range(random_kills))
    victims = [run.rng.choice(["producer", "relay", "consumer-1", "consumer-2"])
               for _ in range(random_kills)]
    while run.procs["load"].poll() is None and now() - t0 < 240:
        run.supervise()
        if times and now() - t0 >= times[0]:
            times.pop(0)
            run.kill9(victims.pop(0))
            run.supervise()
        time.sleep(0.05)
    run.wait_load(10)
    run.drain(240)
    run.metrics["armed"] = armed
    run.finish()


def sc_duplicate_delivery(run):
    """Duplicate delivery: late Produce acks (error_rtt NO_ERROR past the request timeout: real
    duplicates), then every message re-produced (oq_e2e_dup) 1-2 times. The inbox must absorb
    all of it (the offset rewind is its own row: offset_rewind)."""
    calls = 150 if run.opts.smoke else 400
    run.start_pipeline(consumers=2, relay_x=FAST_TIMEOUT, consumer_x=FAST_TIMEOUT)
    run.load(calls, 150, "dd")
    time.sleep(run.rng.uniform(0.3, 1.5))
    for b in run.rng.sample([1, 2, 3], run.rng.randint(1, 3)):
        run.broker_ctl(f"error_rtt {b} Produce NO_ERROR {run.rng.randint(1500, 3000)} "
                       f"{run.rng.randint(1, 4)}")
    run.fault("late Produce acks")
    run.wait_load()
    run.drain(180)
    run.fault("re-producing every call message")
    r = subprocess.run([run.tool("oq_e2e_dup"), "--brokers", run.brokers, "--topic",
                        "onceq.tool-calls", "--times", str(run.rng.randint(1, 2))],
                       capture_output=True, text=True, timeout=120)
    run.say(f"oq_e2e_dup: rc={r.returncode} {r.stdout.strip()}")
    if r.returncode != 0:
        run.fail(f"oq_e2e_dup exit {r.returncode}: {r.stderr[-300:]}")
    # every re-produced message must reach the inbox: bounded wait for the redelivery
    want = 2 * run.q(run.pdb, "SELECT count(*) FROM calls")[0][0]
    run.wait(60, lambda: run.q(run.cdb, "SELECT coalesce(sum(seen),0) FROM inbox")[0][0]
             >= want, "the re-produced messages in the inbox", supervise=True)
    absorbed_ms = round((now() - run.t_fault) * 1000)
    run.drain(120)
    # recovery here: re-produced -> every copy absorbed by the inbox (no call was pending)
    run.metrics["recovery_ms"] = max(absorbed_ms, run.metrics.get("recovery_ms") or 0)
    run.finish()
    if not run.metrics.get("inbox_duplicates"):
        run.fail("no duplicate delivery reached the inbox")


def sc_rebalance_storm(run):
    """Consumers added and killed (-9 or TERM) repeatedly while calls flow."""
    calls, rate = (150, 25) if run.opts.smoke else (500, 40)
    run.start_pipeline(consumers=2)
    run.load(calls, rate, "rb", mix="6,3,1,0,0", sleep_ms=200)
    t_end = now() + calls / rate
    nxt = 3
    actions = 0
    while now() < t_end and run.procs["load"].poll() is None:
        time.sleep(run.rng.uniform(0.5, 1.5))
        live = [n for n in run.procs if n.startswith("consumer-") and run.alive(n)]
        if len(live) < 4 and (len(live) <= 1 or run.rng.random() < 0.5):
            run.start_consumer(nxt)
            run.fault(f"added consumer-{nxt}")
            nxt += 1
        else:
            victim = run.rng.choice(live)
            run.supervised.discard(victim)
            if run.rng.random() < 0.5:
                run.kill9(victim)
            else:
                run.stop(victim)
                run.fault(f"TERM {victim}")
        actions += 1
    run.metrics["storm_actions"] = actions
    run.wait_load()
    run.drain(240)
    run.finish()


def sc_worker_stop(run):
    """A worker SIGSTOPped past its lease during a slow charge (delay_ms); the other worker
    takes over (UNKNOWN -> SAFE_RETRY -> one effect); SIGCONT: the late writes are fenced."""
    lease = ["--lease", "1s", "--recover-every", "200ms"]
    run.port = free_port()
    run.start_broker(["--partitions", "2"])
    run.start_producer()
    run.start_relay()
    run.start_consumer(1, extra=lease)
    run.start_consumer(2, extra=lease)
    run.wait_healthy(30)
    k = 2 if run.opts.smoke else 4
    ids = []
    for i in range(k):
        st, j = http_post(run.port, f"slow-{run.idx}-{i}",
                          {"tool": "charge", "args": {"amount": 10 + i,
                                                      "delay_ms": run.rng.randint(2500, 4000)}})
        if st not in (200, 202):
            raise RunFailed(f"slow charge not accepted: {st}")
        ids.append(j["call_id"])
    with open(run.accepted, "a") as f:
        f.write("\n".join(ids) + "\n")

    def started():
        return run.q(run.cdb, "SELECT call_id, lease_owner FROM executions WHERE state="
                              "'STARTED'") if run.db_exists(run.cdb) else []

    run.wait(60, lambda: len(started()) > 0, "a slow charge STARTED")
    time.sleep(run.rng.uniform(0.1, 0.8))
    rows = started()
    if not rows:
        raise RunFailed("the STARTED execution finished before the stop")
    owner = run.rng.choice(rows)[1]
    if owner not in run.procs:
        raise RunFailed(f"lease owner {owner} is not one of ours")
    stop_s = run.rng.uniform(2.5, 5.0)  # past the 1 s lease, under the 6 s session timeout
    run.send(owner, signal.SIGSTOP)
    run.fault(f"SIGSTOP {owner} for {stop_s:.1f}s (lease 1s)")
    time.sleep(stop_s)
    run.send(owner, signal.SIGCONT)
    run.say(f"SIGCONT {owner}")
    run.drain(120)
    time.sleep(1.0)  # let the resumed worker try its late writes
    ll = run.q(run.cdb, "SELECT count(*) FROM audit WHERE event='lease_lost'")[0][0]
    unk = run.q(run.cdb, "SELECT count(*) FROM audit WHERE event='unknown'")[0][0]
    run.metrics["lease_lost"] = ll
    run.say(f"audit: unknown={unk} lease_lost={ll}")
    if unk == 0:
        run.fail("no takeover: no execution went UNKNOWN while its worker was stopped")
    run.finish()
    if run.metrics.get("effects") != k:
        run.fail(f"{run.metrics.get('effects')} effects for {k} charges")


def sc_broker_faults(run):
    """Broker faults on the embedded broker: a broker down/up, Produce and Fetch errors, leader
    moves, added latency. Producers run with max.in.flight=1 (see docs/CHAOS.md)."""
    calls = 150 if run.opts.smoke else 400
    x = FAST_TIMEOUT + ["-X", "max.in.flight=1"]
    run.start_pipeline(consumers=2, relay_x=x, consumer_x=x)
    run.load(calls, 120, "bf")
    t_end = now() + calls / 120.0
    steps = ["down", "produce_err", "fetch_err", "leader", "rtt"]
    run.rng.shuffle(steps)
    steps = steps[: (3 if run.opts.smoke else 5)]
    errs = ["NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT", "LEADER_NOT_AVAILABLE",
            "_TRANSPORT"]
    for s in steps:
        time.sleep(run.rng.uniform(0.2, 1.0))
        if s == "down":
            b = run.rng.randint(1, 3)
            run.broker_ctl(f"down {b}")
            run.fault(f"broker {b} down")
            time.sleep(run.rng.uniform(1.0, 3.0))
            run.broker_ctl(f"up {b}")
        elif s == "produce_err":
            run.broker_ctl(f"error Produce {run.rng.choice(errs)} {run.rng.randint(1, 6)}")
            run.fault("Produce errors")
        elif s == "fetch_err":
            run.broker_ctl(f"error Fetch {run.rng.choice(errs)} {run.rng.randint(1, 6)}")
            run.fault("Fetch errors")
        elif s == "leader":
            t = run.rng.choice(["onceq.tool-calls", "onceq.tool-results"])
            run.broker_ctl(f"leader {t} {run.rng.randrange(6)} {run.rng.randint(1, 3)}")
            run.fault(f"leader move on {t}")
        elif s == "rtt":
            ms = run.rng.randint(50, 400)
            run.broker_ctl(f"rtt all {ms}")
            run.fault(f"rtt +{ms} ms")
            time.sleep(run.rng.uniform(1.0, 2.5))
            run.broker_ctl("rtt all 0")
        run.supervise()
    run.metrics["broker_steps"] = steps
    while now() < t_end:
        run.supervise()
        time.sleep(0.1)
    run.wait_load()
    run.drain(240)
    run.finish()


def hold_lock(db, seconds, run, label):
    c = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        c.execute("BEGIN IMMEDIATE")
        run.fault(f"{label}: write lock held {seconds:.1f}s")
        time.sleep(seconds)
        c.execute("ROLLBACK")
    finally:
        c.close()


def sc_busy_storm(run):
    """Storage: another process holds the SQLite write lock of calls.db (and of effects.db) for
    seconds while calls flow; clients get 503 or wait, never a 2xx for an unwritten call (every
    2xx call id must be in calls.db), and no corruption."""
    calls = 150 if run.opts.smoke else 400
    run.start_pipeline(consumers=2)
    run.load(calls, 50 if run.opts.smoke else 40, "bs")
    holds = 2 if run.opts.smoke else 4
    for _ in range(holds):
        time.sleep(run.rng.uniform(0.3, 1.2))
        db, label = run.rng.choice([(run.pdb, "calls.db"), (run.cdb, "effects.db")])
        hold_lock(db, run.rng.uniform(1.5, 4.0), run, label)
        run.supervise()
    out = run.wait_load()
    run.metrics["client_retries"] = int(out.get("retries", 0))
    run.drain(240)
    run.finish()


# --- outside calls: HTTP tools against `onceq-downstream` (rows 8, 10) -------------------------
def http_json(port, method, path, body=None, timeout=5.0, headers=None):
    """One request with a JSON body (or none); returns (status, json or None). Raises
    OSError/HTTPException on transport."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json", "Connection": "close",
                           **(headers or {})})
        r = c.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, None
    finally:
        c.close()


def start_downstream(run, args=()):
    """`onceq-downstream` as "ds" on a free port, its ledger in the run folder (self.ddb)."""
    run.dport = free_port()
    run.ddb = os.path.join(run.dir, "ds.db")
    ds_bin = os.path.join(os.path.dirname(run.bin), "onceq-downstream")
    run.spawn("ds", [ds_bin, "--listen", f"127.0.0.1:{run.dport}", "--db",
                     run.ddb, "--seed", str(run.rng.randrange(1, 1 << 40)), *args])

    def up():
        return http_json(run.dport, "GET", "/healthz", timeout=1)[0] == 200
    run.wait(15, up, "downstream /healthz")


def ds_mode(run, mode):
    deadline = now() + 15
    while True:  # the service may be down (the down fault) for a moment
        try:
            st, j = http_json(run.dport, "POST", "/admin/mode", mode)
            break
        except (OSError, http.client.HTTPException):
            if now() > deadline:
                raise RunFailed("downstream /admin/mode: not answering for 15 s")
            time.sleep(0.1)
    if st != 200:
        raise RunFailed(f"downstream /admin/mode {mode}: {st} {j}")
    run.say(f"downstream mode {mode}")


def write_tools(run, variants):
    """examples/tools.json aimed at our downstream, with the variants (dicts; "base": True
    starts from the example "pay" tool) appended (replacing an example of the same name);
    returns the file's path."""
    with open(os.path.join(SRC, "examples", "tools.json")) as f:
        text = f.read().replace("127.0.0.1:8090", f"127.0.0.1:{run.dport}")
    doc = json.loads(text)
    base = doc["tools"][0]
    for v in variants:
        v = dict(v)
        if v.pop("base", False):
            v = {**base, **v}
        doc["tools"] = [x for x in doc["tools"] if x["name"] != v["name"]] + [v]
    path = os.path.join(run.dir, "tools.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def submit_until_answer(run, key, body, timeout=2.0, tries=200, port=None):
    """One logical submit: resent with the same key and body on transport errors, 429, 5xx.
    Returns (status, json) of the first definite answer."""
    for _ in range(tries):
        try:
            st, j = http_post(port or run.port, key, body, timeout=timeout)
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)
            continue
        if st in (429,) or st >= 500:
            time.sleep(0.1)
            continue
        if st in (200, 202):
            with open(run.accepted, "a") as f:
                f.write(j["call_id"] + "\n")
        return st, j
    raise RunFailed(f"submit {key}: no definite answer after {tries} tries")


def eid_of(call_id):
    return "e_" + call_id[2:]


def ledger_count(run, eid):
    """Payments in the downstream's own ledger for one effect id (as key or reference)."""
    return run.q(run.ddb, "SELECT count(*) FROM payments WHERE idem_key = ? OR reference = ?",
                 (eid, eid))[0][0]


def ds_consumer_x(tools):
    return ["--tools", tools, "--recover-every", "200ms", "--max-attempts", "30",
            "--retry-base", "50ms", "--retry-max", "1s", "--lookup-attempts", "100"]


def call_rows(run, tools):
    marks = ",".join("?" * len(tools))
    code = "(error::jsonb)->>'code'" if is_pg(run.pdb) else "json_extract(error, '$.code')"
    return run.q(run.pdb, f"SELECT call_id, idem_key, tool, state, {code} FROM calls "
                          f"WHERE tool IN ({marks})", tuple(tools))


def audit_count(run, call_id, event):
    return run.q(run.cdb, "SELECT count(*) FROM audit WHERE call_id = ? AND event = ?",
                 (call_id, event))[0][0]


DS_TIMEOUT_MS = 1000  # every HTTP tool's timeout here: the slow and late faults go past it


def sc_downstream_faults(run):
    """HTTP tools against `onceq-downstream` with faults drawn from the seed: reply dropped
    after commit, answered late after commit and slow before commit (both past the tool's 1 s
    timeout), 500 before commit, 503 and 429 with Retry-After, and the service down (refusing
    connections) for 0.5-2 s, 1-3 times. Four tools: keys honoured + lookup (`pay`), keys
    honoured without lookup (`pay_keys`), keys ignored with a lookup by reference
    (`pay_ref`), neither (`pay_blind`). Checks: 0 duplicates in the downstream's own ledger
    (`onceq verify --downstream-db`); every keyed or looked-up call `succeeded` with exactly
    one payment; a `pay_blind` call is `needs_review` exactly when its outcome was UNKNOWN
    (a dropped or late reply, a 500, a timeout), else `succeeded`, with at most one payment."""
    n = 6 if run.opts.smoke else 16  # calls per tool
    slow_ms = run.rng.randint(1500, 2500)
    late_ms = run.rng.randint(1500, 3000)
    start_downstream(run)
    keys_hdr = "ignore" if run.brk == "downstream_keys" else "honour"
    tools = write_tools(run, [
        {"base": True, "name": "pay_keys", "lookup": None,
         "headers": {"X-Downstream-Keys": keys_hdr}},
        {"base": True, "name": "pay_ref", "idempotency_header": None, "idempotent": False,
         "headers": {"X-Downstream-Keys": "ignore"},
         "lookup": {"url": f"http://127.0.0.1:{run.dport}/v1/payments?reference={{effect_id}}",
                    "found": [200], "absent": [404],
                    # the service may act up to slow_ms after the send: settle past that
                    "settle_ms": 1 if run.brk == "settle" else slow_ms + 2500}},
        {"base": True, "name": "pay_blind", "idempotency_header": None, "idempotent": False,
         "lookup": None, "headers": {"X-Downstream-Keys": "ignore",
                                     "X-Downstream-Lookup": "off"},
         "final": [400, 402, 404, 409, 422]},
    ])
    # every tool: 1 s timeout (the example's 10 s would outwait every fault)
    with open(tools) as f:
        doc = json.load(f)
    for t in doc["tools"]:
        t["timeout_ms"] = DS_TIMEOUT_MS
        t["connect_timeout_ms"] = 500
        if isinstance(t.get("lookup"), dict):
            t["lookup"]["timeout_ms"] = DS_TIMEOUT_MS
            t["lookup"]["connect_timeout_ms"] = 500
    with open(tools, "w") as f:
        json.dump(doc, f, indent=1)
    run.start_pipeline(consumers=2, consumer_x=ds_consumer_x(tools))
    probs = {"drop-after-commit": run.rng.uniform(0.1, 0.2),
             "late-after-commit": run.rng.uniform(0.04, 0.1),
             "slow": run.rng.uniform(0.04, 0.1), "500": run.rng.uniform(0.04, 0.1),
             "503": run.rng.uniform(0.05, 0.15), "429": run.rng.uniform(0.05, 0.15)}
    spec = ",".join(f"{k}:{v:.2f}" for k, v in probs.items())
    ds_mode(run, {"faults": spec, "slow_ms": slow_ms, "late_ms": late_ms, "retry_after_s": 1})
    run.fault(f"downstream faults {spec} slow {slow_ms} ms late {late_ms} ms")
    names = ["pay", "pay_keys", "pay_ref", "pay_blind"]
    todo = [(t, i) for t in names for i in range(n)]
    run.rng.shuffle(todo)
    lock = threading.Lock()
    errors = []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                t, i = todo.pop()
            try:
                st, j = submit_until_answer(run, f"{t}-{run.idx}-{i}",
                                            {"tool": t, "args": {"amount": 100 + i}})
                if st not in (200, 202):
                    errors.append((t, i, st))
            except RunFailed as ex:
                errors.append((t, i, str(ex)))
            time.sleep(0.02)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()

    def executed():
        return run.q(run.cdb, "SELECT count(*) FROM executions")[0][0]
    # the consumers may still be joining the group: the faults must meet the executions
    run.wait(60, lambda: executed() > 0, "the first execution", supervise=True)
    downs = run.rng.randint(1, 3)
    for _ in range(downs):
        time.sleep(run.rng.uniform(0.3, 1.5))
        ms = run.rng.randint(500, 2000)
        run.wait(15, lambda: http_json(run.dport, "GET", "/healthz", timeout=1)[0] == 200,
                 "the downstream back up")  # after the previous down
        st, _ = http_json(run.dport, "POST", "/admin/down", {"ms": ms})
        run.fault(f"downstream down {ms} ms (answer {st})")
        time.sleep(ms / 1000.0)
        run.supervise()
    for t in threads:
        t.join(120)
    if errors:
        run.fail(f"submits not accepted: {errors[:5]}")
    # keep the faults on until every call was tried at least once, plus 1-3 s; then off:
    # recovery counts from here
    run.wait(60, lambda: executed() >= n * len(names), "every call executed once",
             supervise=True)
    time.sleep(run.rng.uniform(1.0, 3.0))
    ds_mode(run, {"faults": ""})
    run.fault("downstream faults off")
    run.drain(180)
    rows = call_rows(run, names)
    per_state = {}
    unknown_total = 0
    for cid, key, tool, state, code in rows:
        n_led = ledger_count(run, eid_of(cid))
        unk = audit_count(run, cid, "unknown")
        unknown_total += unk > 0
        per_state[(tool, state)] = per_state.get((tool, state), 0) + 1
        if tool == "pay_blind":
            if n_led > 1:
                run.fail(f"{key}: {n_led} payments (a blind tool resent)")
            if state == "needs_review":
                if unk == 0:
                    run.fail(f"{key}: needs_review without an unknown outcome")
            elif state == "succeeded":
                if n_led != 1:
                    run.fail(f"{key}: succeeded with {n_led} payments")
                if unk:
                    run.fail(f"{key}: succeeded after an unknown outcome, without review")
            else:
                run.fail(f"{key}: state {state} ({code}), expected succeeded or needs_review")
        else:
            if state != "succeeded" or n_led != 1:
                run.fail(f"{key}: state {state} ({code}) with {n_led} payments; a tool with "
                         f"keys or a lookup must end succeeded with exactly one")
    if len(rows) != n * len(names):
        run.fail(f"{len(rows)} calls for {n * len(names)} submits")
    run.metrics["states"] = {f"{t}:{s}": c for (t, s), c in sorted(per_state.items())}
    run.metrics["unknown_outcomes"] = unknown_total
    run.say(f"states {run.metrics['states']}, calls with an unknown outcome {unknown_total}")
    if unknown_total == 0:
        run.fail("no call had an unknown outcome: the faults did not bite")
    run.finish()


def faketime_lib():
    """libfaketime's multi-threaded preload library (Debian `faketime`), or None."""
    for d in sorted(os.listdir("/usr/lib")) if os.path.isdir("/usr/lib") else []:
        p = os.path.join("/usr/lib", d, "faketime", "libfaketimeMT.so.1")
        if os.path.exists(p):
            return p
    p = "/usr/lib/faketime/libfaketimeMT.so.1"
    return p if os.path.exists(p) else None


def sc_clock_step(run):
    """Row 12: the host's wall clock steps (NTP, `date -s`) forward and back while HTTP tools
    are in flight. Two consumers run under libfaketime: CLOCK_REALTIME comes from a file the
    run rewrites (a step for every process of the host at once), CLOCK_MONOTONIC/BOOTTIME keep
    running; the downstream (another host) keeps the real clock. Tools without keys, each
    request held 2.5-4 s by the downstream (inside their 10 s timeout): `ref_slow` (lookup by
    reference, settle 10 s) and `blind_slow` (no lookup). 3-5 excursions drawn from the seed,
    0.5-3 s apart, while calls flow: a step of 1-3 h forward or back, and back to the real time
    0.5-1.5 s later. Checks: every call `succeeded` with exactly one payment, no `needs_review`, 0
    duplicates in the ledger (a lease kept in wall time lapses on a forward step: review for
    `blind_slow`, a resend after a "not found" that looks older than settle for `ref_slow`)."""
    lib = faketime_lib()
    if lib is None:
        raise RunFailed("libfaketime is not installed (apt-get install faketime)")
    n = 4 if run.opts.smoke else 10  # calls per tool
    slow_ms = run.rng.randint(2500, 4000)
    clock = os.path.join(run.dir, "faketime.rc")
    with open(clock, "w") as f:
        f.write("+0\n")
    start_downstream(run, ["--slow", f"{slow_ms}ms"])
    url = f"http://127.0.0.1:{run.dport}/v1/payments"
    common = {"url": url, "body": {"amount": "{amount}", "reference": "{effect_id}"},
              "idempotency_header": None, "idempotent": False, "timeout_ms": 10000}
    tools = write_tools(run, [
        {**common, "name": "ref_slow",
         "headers": {"X-Downstream-Fault": "slow", "X-Downstream-Keys": "ignore"},
         "lookup": {"url": url + "?reference={effect_id}", "found": [200], "absent": [404],
                    "settle_ms": 10000}},
        {**common, "name": "blind_slow",
         "headers": {"X-Downstream-Fault": "slow", "X-Downstream-Keys": "ignore",
                     "X-Downstream-Lookup": "off"}},
    ])
    env = {"LD_PRELOAD": lib, "FAKETIME_TIMESTAMP_FILE": clock, "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    if run.brk == "clock_boottime":  # the lease clock's base steps too (no real host does that)
        del env["FAKETIME_DONT_FAKE_MONOTONIC"]
    run.start_pipeline(consumers=2, consumer_x=["--tools", tools, "--recover-every", "200ms"],
                       envs={"consumer-1": env, "consumer-2": env})
    names = ["ref_slow", "blind_slow"]
    todo = [(t, i) for t in names for i in range(n)]
    run.rng.shuffle(todo)
    errors = []

    def client():
        for t, i in todo:
            try:
                st, _ = submit_until_answer(run, f"{t}-{run.idx}-{i}",
                                            {"tool": t, "args": {"amount": 100 + i}})
                if st not in (200, 202):
                    errors.append((t, i, st))
            except RunFailed as ex:
                errors.append((t, i, str(ex)))
            time.sleep(0.2)

    th = threading.Thread(target=client)
    th.start()

    def started():
        return run.q(run.cdb, "SELECT count(*) FROM audit WHERE event = 'started'")[0][0]
    run.wait(60, lambda: started() > 0, "the first request", supervise=True)
    def set_clock(off):
        with open(clock + ".new", "w") as f:
            f.write(f"{off:+d}\n")
        os.replace(clock + ".new", clock)

    # Excursions: a step, and back to the real time 0.5-1.5 s later. (Short on purpose: glibc's
    # C11 cnd_timedwait, which librdkafka waits with, bypasses libfaketime while its deadlines
    # come from the faked clock, so with the clock ahead librdkafka's idle waits last as long
    # as the offset; no real host has that skew.)
    steps = []
    for _ in range(run.rng.randint(3, 5)):
        time.sleep(run.rng.uniform(0.5, 3.0))
        off = run.rng.choice([1, -1]) * run.rng.randint(3600, 3 * 3600)
        set_clock(off)
        run.fault(f"consumers' wall clock stepped {off:+d} s")
        time.sleep(run.rng.uniform(0.5, 1.5))
        set_clock(0)
        run.fault("consumers' wall clock stepped back to the real time")
        steps.append(off)
        run.supervise()
    th.join(180)
    if errors:
        run.fail(f"submits not accepted: {errors[:5]}")
    run.drain(180)
    time.sleep(slow_ms / 1000.0 + 1)  # a resend would land meanwhile
    rows = call_rows(run, names)
    for cid, key, tool, state, code in rows:
        n_led = ledger_count(run, eid_of(cid))
        if state != "succeeded" or n_led != 1:
            run.fail(f"{key}: state {state} ({code}) with {n_led} payments; expected "
                     f"succeeded with exactly one")
    reviews = run.q(run.cdb, "SELECT count(*) FROM audit WHERE event = 'needs_review'")[0][0]
    if reviews:
        run.fail(f"{reviews} call(s) went to review")
    if len(rows) != n * len(names):
        run.fail(f"{len(rows)} calls for {n * len(names)} submits")
    run.metrics["clock_steps_s"] = steps
    run.finish()


def sc_downstream_negative(run):
    """Negative control of row 8: a tool falsely declared idempotent (`liar`: resent with the
    same key after an unknown outcome) against a downstream that ignores keys, half the replies
    dropped after commit: the downstream's ledger must show duplicates and `onceq verify
    --downstream-db` must fail (exit 3) on them; the same calls with honoured keys (`honest`)
    in the same run make none."""
    n = 8 if run.opts.smoke else 12
    start_downstream(run)
    tools = write_tools(run, [
        {"base": True, "name": "liar", "lookup": None,
         "headers": {"X-Downstream-Keys": "ignore"}},
        {"base": True, "name": "honest", "lookup": None}])
    run.start_pipeline(consumers=1, consumer_x=ds_consumer_x(tools) + ["--max-attempts", "8"])
    rate = round(run.rng.uniform(0.4, 0.6), 2)
    ds_mode(run, {"faults": f"drop-after-commit:{rate}"})
    run.fault(f"drop-after-commit:{rate}")
    for i in range(n):
        for t in ("liar", "honest"):
            submit_until_answer(run, f"{t}-{run.idx}-{i}", {"tool": t, "args": {"amount": 3}})
    run.drain(120)
    ds_mode(run, {"faults": ""})
    count = {"liar": 0, "honest": 0}
    for cid, key, tool, state, code in call_rows(run, ["liar", "honest"]):
        count[tool] += ledger_count(run, eid_of(cid))
    run.metrics["logical_dup_effects"] = count["liar"] - n
    run.say(f"ledger: liar {count['liar']} payments for {n} calls, honest {count['honest']}")
    if count["honest"] != n:
        run.fail(f"keys honoured, yet {count['honest']} payments for {n} calls")
    if count["liar"] <= n:
        run.fail(f"negative control: the false declaration made no duplicate "
                 f"({count['liar']} payments for {n} calls): the checker would not see them")
    run.finish(verify_rc=3)
    if run.metrics.get("downstream_dups") != count["liar"] - n:
        run.fail(f"verify's downstream_dup {run.metrics.get('downstream_dups')} != "
                 f"{count['liar'] - n} in the ledger")
    run.metrics["downstream_dups_control"] = run.metrics.pop("downstream_dups", 0)


def sc_retry_payload(run):
    """Row 10. (a) The same payload retried after a retryable failure: HTTP `pay` calls against
    a downstream answering 503 + Retry-After to 70-90 % of the requests until 0.5-1.5 s after
    the first retryable failure, and compiled
    `fail {retryable:true}` calls (every run fails retryably until --max-attempts); the client
    resubmits the same key and body several times at random moments while the calls retry,
    and once more after every call ended (after the drain): the same call_id every time, one
    call per key. A `pay` call: one payment, the late resubmit a 200 replay of the succeeded
    call. A `fail` call: no effect; a resubmit while an attempt runs never runs the tool again
    (each attempt: --max-attempts runs, ended once), one after it failed retryably starts
    exactly one new attempt (the producer's RETRY_RESET, the late one always does), and every
    attempt was one the client was answered with. (b) A different payload racing
    the original: the original and 5-10 other bodies under one key sent within +-30 ms of each
    other (and more different bodies while it retries): exactly one body gets 2xx, every
    other 422, and the payment in the ledger has the accepted body's amount."""
    # (the smoke's 4 pay calls: with p503 >= 0.7 a row without any retryable failure, which
    # tested nothing and fails, has a chance under 1 %; at 3 calls and 0.5 it was 1 in 8)
    n = 4 if run.opts.smoke else 6
    start_downstream(run)
    tools = write_tools(run, [])
    max_att = 5  # the 503 window below (<= 1.5 s after the first, Retry-After 1 s): 3 tries
    run.start_pipeline(consumers=2, consumer_x=ds_consumer_x(tools) + ["--max-attempts",
                                                                      str(max_att)])
    p503 = round(run.rng.uniform(0.7, 0.9), 2)
    ds_mode(run, {"faults": f"503:{p503}", "retry_after_s": 1})
    run.fault(f"downstream 503:{p503} with Retry-After 1 s")
    newkey = run.brk == "new_key"
    results = {}  # key -> list of (status, call_id, attempt, call status)
    lock = threading.Lock()

    def answer(key, k, body):
        st, j = submit_until_answer(run, k, body)
        j = j or {}
        got = (st, j.get("call_id"), j.get("attempt"), j.get("status"))
        with lock:
            results.setdefault(key, []).append(got)
        return got

    def resubmit(key, body, times, first_delay):
        time.sleep(first_delay)
        for r in range(times):
            answer(key, f"{key}-retry{r}" if newkey and r else key, body)
            time.sleep(run.rng.uniform(0.1, 0.8))

    threads = []
    same = []
    bodies = {}
    for i in range(n):
        for tool, args in (("pay", {"amount": 200 + i}), ("fail", {"retryable": True})):
            key = f"same-{tool}-{run.idx}-{i}"
            same.append((key, tool))
            bodies[key] = {"tool": tool, "args": args}
            threads.append(threading.Thread(target=resubmit, args=(
                key, {"tool": tool, "args": args}, run.rng.randint(3, 5),
                run.rng.uniform(0, 0.5))))
    # (b) races: per key one original and k other bodies at nearly the same moment
    races = []
    race_res = {}

    def racer(key, amount, at):
        while now() < at:
            time.sleep(0.001)
        st, j = submit_until_answer(run, key, {"tool": "pay", "args": {"amount": amount}})
        with lock:
            race_res.setdefault(key, []).append((amount, st))

    t_race = now() + 0.8
    for i in range(n):
        key = f"race-{run.idx}-{i}"
        k = run.rng.randint(5, 10)
        amounts = [300 + i] + [1000 + 10 * i + j for j in range(k)]
        races.append((key, amounts))
        for a in amounts:
            threads.append(threading.Thread(target=racer, args=(
                key, a, t_race + run.rng.uniform(-0.03, 0.03))))
    for t in threads:
        t.start()
    run.wait(60, lambda: run.q(run.cdb, "SELECT count(*) FROM audit a JOIN executions x USING "
                                        "(call_id) WHERE x.tool = 'pay' AND a.event = "
                                        "'failed_retryable'")[0][0] > 0,
             "a pay call failing retryably", supervise=True)
    window = run.rng.uniform(0.5, 1.5)
    time.sleep(window)
    ds_mode(run, {"faults": ""})
    run.fault(f"503s off {window:.1f} s after the first retryable failure")
    for t in threads:
        t.join(120)
    # more different bodies after the race (the accepted ones may still be running)
    for key, amounts in races:
        racer(key, 5000 + amounts[0], now())
    run.drain(180)
    # every call has ended: each key once more (a `fail` call starts a new attempt)
    late = {key: answer(key, f"{key}-after" if newkey else key, bodies[key]) for key, _ in same}
    run.fault("every same-key call resubmitted once more after it ended")
    run.drain(180)
    # (a) checks
    for key, tool in same:
        got = results.get(key, [])
        ids = {g[1] for g in got}
        codes = sorted({g[0] for g in got})
        if len(ids) != 1 or any(g[0] not in (200, 202) for g in got):
            run.fail(f"{key}: resubmits gave codes {codes} and {len(ids)} call ids")
    calls = dict((k, (c, t, s)) for c, k, t, s, _ in call_rows(run, ["pay", "fail"]))
    retryable_runs = 0
    for key, tool in same:
        if newkey:
            break
        if key not in calls:
            run.fail(f"{key}: no call")
            continue
        cid, t, state = calls[key]
        if tool == "pay":
            if state != "succeeded" or ledger_count(run, eid_of(cid)) != 1:
                run.fail(f"{key}: {state} with {ledger_count(run, eid_of(cid))} payments")
            if late[key][0] != 200 or late[key][3] != "succeeded":
                run.fail(f"{key}: resubmit after the end answered {late[key]}, not a 200 replay "
                         f"of the succeeded call")
            retryable_runs += run.q(run.cdb, "SELECT count(*) FROM audit WHERE call_id=? AND "
                                             "event='failed_retryable'", (cid,))[0][0]
        else:
            att = run.q(run.pdb, "SELECT attempt FROM calls WHERE call_id=?", (cid,))[0][0]
            runs_ = run.q(run.cdb, "SELECT attempt, tries FROM executions WHERE call_id=?",
                          (cid,))
            eff = run.q(run.cdb, "SELECT count(*) FROM effects WHERE call_id=?", (cid,))[0][0]
            if state != "failed" or eff != 0:
                run.fail(f"{key}: fail tool ended {state} with {eff} effects")
            if late[key][0] != 202 or late[key][3] != "pending" or late[key][2] != att:
                run.fail(f"{key}: resubmit after the end answered {late[key]}: expected 202 "
                         f"pending, attempt {att} (a new attempt of the failed call)")
            seen = max(g[2] or 0 for g in results.get(key, []))
            if att < 2 or seen != att:
                run.fail(f"{key}: attempt {att}, the client was answered up to attempt {seen}: "
                         f"an attempt nobody resubmitted for")
            if runs_ != [(att, max_att)]:
                run.fail(f"{key}: (attempt, tool runs) {runs_}, expected [({att}, {max_att})]")
            per = dict(((a, ev), n) for a, ev, n in run.q(
                run.cdb, "SELECT attempt, event, count(*) FROM audit WHERE call_id=? AND event "
                         "IN ('failed_retryable','failed_final') GROUP BY attempt, event", (cid,)))
            for a in range(1, att + 1):
                if (per.get((a, "failed_retryable"), 0), per.get((a, "failed_final"), 0)) != \
                        (max_att - 1, 1):
                    run.fail(f"{key}: attempt {a} ran {per.get((a, 'failed_retryable'), 0)} "
                             f"retryable + {per.get((a, 'failed_final'), 0)} final runs, expected "
                             f"{max_att - 1} + 1: a resubmit ran the tool again within an attempt")
            run.metrics.setdefault("fail_tool_runs", []).append(runs_)
            run.metrics.setdefault("fail_attempts", []).append(att)
    same_keys = {k for k, _ in same}
    n_calls = run.q(run.pdb, "SELECT count(*) FROM calls WHERE idem_key LIKE 'same-%'")[0][0]
    if n_calls != len(same_keys):
        run.fail(f"{n_calls} calls for {len(same_keys)} logical requests (resubmits made calls)")
    run.metrics["retryable_failures"] = retryable_runs
    # (b) checks
    for key, amounts in races:
        got = race_res.get(key, [])
        ok = [a for a, st in got if st in (200, 202)]
        bad = [st for a, st in got if st not in (200, 202, 422)]
        if len(ok) != 1 or bad or len(got) != len(amounts) + 1:
            run.fail(f"{key}: {len(ok)} bodies accepted {ok}, other codes {bad}")
            continue
        cid = calls.get(key, (None,))[0]
        paid = run.q(run.ddb, "SELECT amount FROM payments WHERE idem_key = ?",
                     (eid_of(cid),)) if cid else []
        if paid != [(ok[0],)]:
            run.fail(f"{key}: accepted amount {ok[0]}, ledger {paid}")
    run.say(f"retryable failures seen by pay calls: {retryable_runs}")
    if retryable_runs == 0:
        run.fail("no retryable failure happened: the row tested nothing")
    run.finish()


def lose_outbox_rows(run, db, seq_from, label):
    """Move the relay watermark of db past rows above seq_from that no relay has published (the
    relays of db are dead): they are 'delivered' but never sent, as a broker that acknowledged
    writes it never stored leaves it. Returns the call ids of the lost rows."""
    top = run.q(db, "SELECT coalesce(max(seq), 0) FROM outbox")[0][0]
    if top <= seq_from:
        run.note(f"{label}: no unpublished row to lose")
        return []
    wm = run.rng.randint(seq_from + 1, top)
    c = sqlite3.connect(db, timeout=30)
    try:
        with c:
            n = c.execute("UPDATE relay_lease SET published_seq = ? WHERE name = 'outbox' AND "
                          "published_seq <= ?", (wm, seq_from)).rowcount
            if n == 0:  # no lease row yet (the relay never held it)
                c.execute("INSERT INTO relay_lease(name, owner, fence, expires_at, "
                          "published_seq) VALUES ('outbox', 'chaos:lost', 1, 0, ?)", (wm,))
        lost = [r[0] for r in c.execute("SELECT key FROM outbox WHERE seq > ? AND seq <= ?",
                                        (seq_from, wm))]
    finally:
        c.close()
    run.fault(f"{label}: {len(lost)} messages lost (watermark {seq_from} -> {wm}, top {top})")
    return lost


def sc_lost_messages(run):
    """Row 11: lost call and result messages with the redrive on (--redrive-after 2s). Call
    messages: the relay is killed (-9), calls keep coming for 0.5-1.5 s, and its watermark is
    moved past a random part of the rows it never published, then it restarts. Result
    messages: the consumers are restarted with their result relay off until 0.5-1.5 s after
    their first result, killed, and the result watermark moved past a random part of the results nobody
    published; then they restart normally. Both, in random order, under load. Checks: every
    call terminal, exactly one effect each (verify), every lost call has a `redrive` audit row,
    every call whose result was lost has its result applied."""
    calls, rate = (120, 60) if run.opts.smoke else (300, 60)
    redrive = "0" if run.brk == "redrive_off" else "2s"
    run.port = free_port()
    run.start_broker()
    run.start_producer(extra=("--redrive-after", redrive, "--redrive-interval", "200ms"))
    run.start_relay()
    for i in (1, 2):
        run.start_consumer(i)
    run.wait_healthy(30)
    run.wait(30, lambda: run.db_exists(run.cdb),
             "consumer database", supervise=True)
    run.load(calls, rate, "lm")
    t_end = now() + calls / rate
    order = ["calls", "results"]
    run.rng.shuffle(order)
    lost_calls, lost_results = [], []
    cons = ["consumer-1", "consumer-2"]
    for what in order:
        time.sleep(run.rng.uniform(0.3, 1.2))
        if what == "calls":
            run.supervised.discard("relay")
            run.kill9("relay")
            seq0 = run.q(run.pdb, "SELECT coalesce(max(seq), 0) FROM outbox")[0][0]
            time.sleep(run.rng.uniform(0.5, 1.5))
            lost_calls = lose_outbox_rows(run, run.pdb, seq0, "call messages")
            run.restart("relay")
        else:
            for c in cons:
                run.supervised.discard(c)
                run.kill9(c)
            seq0 = run.q(run.cdb, "SELECT coalesce(max(seq), 0) FROM outbox")[0][0]
            for i in (1, 2):
                run.start_consumer(i, extra=("--no-relay",))
                run.supervised.discard(f"consumer-{i}")
            # they rejoin the group first (the dead members' session: 6 s): wait for results
            run.wait(30, lambda: run.q(run.cdb, "SELECT coalesce(max(seq), 0) FROM outbox")
                     [0][0] > seq0, "results written with the result relay off")
            time.sleep(run.rng.uniform(0.5, 1.5))
            for c in cons:
                run.kill9(c)
            lost_results = lose_outbox_rows(run, run.cdb, seq0, "result messages")
            for i in (1, 2):
                run.start_consumer(i)
        run.supervise()
    while now() < t_end:
        run.supervise()
        time.sleep(0.1)
    run.wait_load()
    run.drain(60 if run.brk else 180)
    redriven = {r[0] for r in run.q(run.pdb, "SELECT DISTINCT call_id FROM audit WHERE "
                                             "event = 'redrive'")}
    missing = [c for c in lost_calls if c not in redriven]
    if missing:
        run.fail(f"{len(missing)} lost call messages without a redrive: {missing[:3]}")
    applied = {r[0] for r in run.q(run.pdb, "SELECT call_id FROM result_inbox WHERE "
                                            "outcome = 'applied'")}
    unapplied = [c for c in lost_results if c not in applied]
    if unapplied:
        run.fail(f"{len(unapplied)} lost results never applied: {unapplied[:3]}")
    run.metrics.update(lost_call_messages=len(lost_calls), lost_results=len(lost_results),
                       redriven=len(redriven))
    run.say(f"lost: {len(lost_calls)} call messages, {len(lost_results)} results; "
            f"{len(redriven)} calls redriven")
    if not lost_calls and not lost_results:
        run.fail("nothing was lost: the row tested nothing")
    run.finish()


def fill_disk(path):
    """Write a filler file until the file system is full (ENOSPC); returns its size."""
    n = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                n += f.write(chunk)
        except OSError:
            pass
        small = b"\0" * 512
        try:
            while True:
                n += f.write(small)
        except OSError:
            pass
    return n


def sc_disk_full(run):
    """Row 9b: calls.db on a small tmpfs (mounted for the run, unmounted after) that is filled
    to the last byte by a filler file 1-3 times for 1.5-4 s each while calls flow, then freed.
    Checks: the clients saw 503s while full and retried with the same key; no 2xx for an
    unwritten call (every 2xx call id is in calls.db: verify --accepted); every call recovers
    once space returns (drained, one effect each); PRAGMA integrity_check ok."""
    disk = os.path.join(run.dir, "disk")
    os.makedirs(disk, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", disk],
                       capture_output=True, text=True)
    if r.returncode != 0:
        run.note(f"cannot mount a tmpfs here ({r.stderr.strip()[:120]}): row not run")
        run.metrics["skipped"] = True
        return
    run.cleanups.append(lambda: subprocess.run(["umount", "-l", disk], capture_output=True))
    run.pdb = os.path.join(disk, "calls.db")
    calls = 150 if run.opts.smoke else 400
    run.start_pipeline(consumers=2)
    run.load(calls, 50, "df")
    filler = os.path.join(disk, "filler")
    fills = 1 if run.opts.smoke else run.rng.randint(1, 3)
    full_503 = 0
    for k in range(fills):
        time.sleep(run.rng.uniform(0.5, 1.5))
        size = fill_disk(filler)
        hold = run.rng.uniform(1.5, 4.0)
        run.fault(f"disk full ({size >> 10} KiB filler) for {hold:.1f}s")
        t_end = now() + hold
        while now() < t_end:  # probe: a submit while full must not be 2xx unless written
            try:
                st, j = http_post(run.port, f"df-probe-{run.idx}-{k}-{int(now() * 1000)}",
                                  {"tool": "charge", "args": {"amount": 1}}, timeout=2)
                if st in (200, 202):  # not into run.accepted: oq_e2e_load appends there
                    with open(run.accepted + ".probes", "a") as f:  # (a torn line otherwise)
                        f.write(j["call_id"] + "\n")
                elif st in (503, 507):
                    full_503 += 1
                else:
                    run.fail(f"a submit on a full disk answered {st}")
            except (OSError, http.client.HTTPException):
                pass
            run.supervise()
            time.sleep(0.2)
        if run.brk != "no_space_return":
            os.unlink(filler)
            run.say("space returned")
    out = run.wait_load(60 if run.brk else 240)
    if os.path.exists(run.accepted + ".probes"):
        with open(run.accepted + ".probes") as f, open(run.accepted, "a") as g:
            g.write(f.read())
    run.metrics["client_retries"] = int(out.get("retries", 0))
    run.metrics["probe_503"] = full_503
    run.say(f"503 to probes while full: {full_503}, load retries {out.get('retries')}")
    if full_503 + int(out.get("retries", 0)) == 0:
        run.fail("no client saw a 503 while the disk was full: the fault did not bite")
    run.drain(60 if run.brk else 240)
    run.finish()
    if run.failures:  # keep the database for a look: the tmpfs goes with the unmount
        subprocess.run(["cp", "-a", disk, os.path.join(run.dir, "disk-copy")])


def proc_sample(pid):
    """(RSS KiB, open fds) of a live process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


def slope_per_min(pts):
    """Least-squares slope of (t seconds, v) in v per minute; 0 for fewer than 3 points."""
    if len(pts) < 3:
        return 0.0
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    return 0.0 if den == 0 else 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / den


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else 0


SOAK_RSS_TOL = (1.5, 16 * 1024)  # last third's median RSS may be 1.5x the first's + 16 MiB
SOAK_FD_TOL = 32                 # last third's median fds may be the first's + 32


def sc_soak(run):
    """Soak (--soak-minutes M): calls flow at 40/s for M minutes while a random process
    (producer, relay, a consumer) is killed with -9 every 2-6 s and restarted; every 2 s every
    daemon's RSS and open descriptors are read from /proc. Fails on unbounded growth: per
    daemon (all its incarnations), the median of the last third of the samples against the
    first third (RSS: at most 1.5x + 16 MiB; descriptors: at most +32), plus the usual checks
    after the drain. The per-daemon figures and the RSS slope go into the report."""
    minutes = run.opts.soak_minutes or 0.5
    rate = 40
    calls = int(rate * minutes * 60)
    run.start_pipeline(consumers=2)
    run.load(calls, rate, "sk", mix="6,3,1,0,0", sleep_ms=20)
    t0 = now()
    t_end = t0 + minutes * 60
    next_kill = t0 + run.rng.uniform(2, 6)
    next_sample = t0
    samples = {}  # name -> [(t, rss, fds)]
    kills = 0
    while now() < t_end and run.procs["load"].poll() is None:
        run.supervise()
        if now() >= next_sample:
            for name in ("broker", "producer", "relay", "consumer-1", "consumer-2"):
                p = run.procs.get(name)
                s = proc_sample(p.pid) if p is not None and p.poll() is None else None
                if s:
                    samples.setdefault(name, []).append((now() - t0, s[0], s[1]))
            next_sample += 2
        if now() >= next_kill:
            run.kill9(run.rng.choice(["producer", "relay", "consumer-1", "consumer-2"]))
            kills += 1
            run.supervise()
            next_kill = now() + run.rng.uniform(2, 6)
        time.sleep(0.05)
    run.wait_load(240)
    run.drain(240)
    table = []
    for name, pts in sorted(samples.items()):
        third = max(1, len(pts) // 3)
        first, last = pts[:third], pts[-third:]
        r0, r1 = median([p[1] for p in first]), median([p[1] for p in last])
        f0, f1 = median([p[2] for p in first]), median([p[2] for p in last])
        rt, ft = ((1.0, 0), 0) if run.brk == "soak_tight" else (SOAK_RSS_TOL, SOAK_FD_TOL)
        ok = r1 <= r0 * rt[0] + rt[1] and f1 <= f0 + ft
        table.append({"process": name, "samples": len(pts), "rss_first_kib": r0,
                      "rss_last_kib": r1, "rss_max_kib": max(p[1] for p in pts),
                      "rss_slope_kib_per_min": round(slope_per_min([(p[0], p[1])
                                                                    for p in pts]), 1),
                      "fds_first": f0, "fds_last": f1, "fds_max": max(p[2] for p in pts),
                      "bounded": ok})
        if len(pts) >= 6 and not ok:
            run.fail(f"{name}: unbounded growth: RSS {r0} -> {r1} KiB, fds {f0} -> {f1}")
    run.metrics["soak"] = table
    run.metrics["soak_minutes"] = minutes
    run.metrics["soak_kills"] = kills
    run.say(f"soak: {kills} kills; {table}")
    run.finish()


def soak_md(rows):
    out = []
    for r in rows:
        for d in r["details"]:
            if "soak" not in d:
                continue
            out += ["", "", f"Soak ({d['soak_minutes']} min, {d['soak_kills']} kill -9s, samples "
                    f"every 2 s; bound: last third's median RSS <= 1.5x the first's + 16 MiB, "
                    f"descriptors <= +32):\n",
                    "| process | samples | RSS first third MiB | last third MiB | max MiB | "
                    "slope KiB/min | fds first | last | max | bounded |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
            for x in d["soak"]:
                out.append(f"| {x['process']} | {x['samples']} | {x['rss_first_kib'] / 1024:.1f}"
                           f" | {x['rss_last_kib'] / 1024:.1f} | {x['rss_max_kib'] / 1024:.1f} |"
                           f" {x['rss_slope_kib_per_min']} | {x['fds_first']} | "
                           f"{x['fds_last']} | {x['fds_max']} | "
                           f"{'yes' if x['bounded'] else 'NO'} |")
    return "\n".join(out)


def sc_offset_rewind(run):
    """Row 4c: the consumer group's committed offsets rewound to 0 (tests/tools/
    oq_group_rewind, an operator's "reset offsets to earliest") while the consumers are
    stopped (TERM: they leave the group), at a random point after 30-100 % of the calls
    finished; the consumers restart and every message still in the topic is delivered again.
    Checks: every message the inbox had seen before the rewind is seen again (its `seen` grew)
    and absorbed: inbox duplicates > 0, 0 duplicate effects."""
    calls = 100 if run.opts.smoke else 300
    run.start_pipeline(consumers=2)
    run.load(calls, 100, "or")
    frac = run.rng.uniform(0.3, 1.0)
    run.wait(120, lambda: run.q(run.pdb, "SELECT count(*) FROM calls WHERE state NOT IN "
                                         "('pending','running')")[0][0] >= frac * calls,
             f"{frac:.0%} of the calls done", supervise=True)
    cons = [n for n in run.procs if n.startswith("consumer-")]
    for c in cons:
        run.supervised.discard(c)
        run.stop(c)
    before = dict(run.q(run.cdb, "SELECT message_id, seen FROM inbox"))
    seen0 = len(before)
    run.fault(f"offsets rewound to 0 with the consumers stopped ({seen0} messages seen)")
    r = subprocess.run([run.tool("oq_group_rewind"), "--brokers", run.brokers, "--group",
                        "onceq-workers", "--topic", "onceq.tool-calls", "--timeout-ms",
                        "30000"] + ([] if run.brk == "rewind_session" else
                                    ["--session-timeout-ms", "6000"]),
                       capture_output=True, text=True, timeout=60)
    run.say(f"oq_group_rewind rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    if r.returncode != 0:
        raise RunFailed(f"oq_group_rewind exit {r.returncode}: {r.stderr[-300:]}")
    t_rw = now()
    for c in cons:
        run.start_consumer(int(c.split("-")[1]))

    def all_again():
        now_seen = dict(run.q(run.cdb, "SELECT message_id, seen FROM inbox"))
        return all(now_seen.get(m, 0) > s for m, s in before.items())
    run.wait(150, all_again, "every message delivered before the rewind delivered again",
             supervise=True)
    run.metrics["redelivered_after_s"] = round(now() - t_rw, 2)
    run.wait_load()
    run.drain(180)
    run.metrics["recovery_ms"] = max(run.metrics.get("recovery_ms") or 0,
                                     round((now() - t_rw) * 1000))
    run.finish()
    if not run.metrics.get("inbox_duplicates"):
        run.fail("no re-delivered copy reached the inbox")


def review_fence(run, cid):
    return run.q(run.cdb, "SELECT fence FROM executions WHERE call_id = ?", (cid,))[0][0]


def review_cli(run, cid, *args):
    """`onceq review resolve CID ARGS` on the run's consumer database; returns its exit code."""
    r = subprocess.run([run.bin, "review", "resolve", cid, "--db", run.cdb, "--by", "chaos",
                        *args], capture_output=True, text=True, timeout=60)
    run.say(f"review resolve {cid} {' '.join(args)}: exit {r.returncode} {r.stderr.strip()[-200:]}")
    return r.returncode


def wait_state(run, cids, state, what, pred=None):
    def done():
        rows = dict(run.q(run.pdb, "SELECT call_id, state FROM calls"))
        return all(rows.get(c) == state for c in cids) and (pred is None or pred())
    run.wait(60, done, what, supervise=True)


def sc_review_expiry(run):
    """Issue 17, item 1: unresolved reviews never expire. A tool with neither keys nor lookup
    whose every reply is dropped after commit: 2-4 calls end needs_review (one payment each).
    The producer runs with --key-ttl 1-2 s and purges every second; 1.5-3 s past the TTL each
    key is resubmitted 1-3 times with the same body: the same call comes back and nothing is
    sent. Then each review is resolved `committed` with the payment the ledger holds."""
    n = run.rng.randint(2, 4)
    ttl = run.rng.randint(1, 2)
    start_downstream(run)
    tools = write_tools(run, [{"name": "blind_drop",
                               "url": f"http://127.0.0.1:{run.dport}/v1/payments",
                               "body": {"amount": "{amount}"}, "idempotency_header": None,
                               "headers": {"X-Downstream-Fault": "drop-after-commit"}}])
    run.port = free_port()
    run.start_broker()
    run.start_producer(None, ["--key-ttl", f"{ttl}s", "--purge-interval", "1s"])
    run.start_relay()
    run.start_consumer(1, None, ds_consumer_x(tools))
    run.wait_healthy(30)
    first = {}
    for i in range(n):
        st, j = submit_until_answer(run, f"rx-{run.idx}-{i}",
                                    {"tool": "blind_drop", "args": {"amount": 100 + i}})
        first[i] = j["call_id"]
    wait_state(run, first.values(), "needs_review", "every call in review")
    run.fault(f"key-ttl {ttl}s, reviews left unresolved past it")
    time.sleep(ttl + run.rng.uniform(1.5, 3.0))
    for i in range(n):
        for _ in range(run.rng.randint(1, 3)):
            st, j = submit_until_answer(run, f"rx-{run.idx}-{i}",
                                        {"tool": "blind_drop", "args": {"amount": 100 + i}})
            if j is None or j.get("call_id") != first[i]:
                run.fail(f"key rx-{run.idx}-{i} past its TTL: {st} {j} (was {first[i]})")
    time.sleep(1.5)
    pays = run.q(run.ddb, "SELECT count(*) FROM payments")[0][0]
    if pays != n:
        run.fail(f"{pays} payments in the ledger for {n} calls")
    for i in range(n):
        pid = run.q(run.ddb, "SELECT id FROM payments WHERE amount = ?", (100 + i,))[0][0]
        if review_cli(run, first[i], "--fence", str(review_fence(run, first[i])), "--as",
                      "committed", "--ref", pid, "--note", "seen in the ledger"):
            run.fail(f"resolve {first[i]} refused")
    run.drain(60)
    wait_state(run, first.values(), "succeeded", "every resolution applied")
    run.finish()


def sc_review_fence(run):
    """Issue 17, item 3: a review decision is pinned to its episode. A tool that honours keys,
    undeclared, no lookup, every reply dropped: 2-4 calls in review. Operator A resolves each
    `retry`; the resend's reply is dropped too and the call is back in review with another
    fence. Operator B's `committed`, decided on the first episode (old fence), 0.1-1 s later,
    must be refused (exit 9, review_moved) and change nothing; then the current fence's `retry`
    with the faults off: one payment per key."""
    n = run.rng.randint(2, 4)
    start_downstream(run)
    tools = write_tools(run, [{"base": True, "name": "keyed_undeclared", "idempotent": False,
                               "lookup": None}])
    run.start_pipeline(consumers=1, consumer_x=ds_consumer_x(tools))
    ds_mode(run, {"faults": "drop-after-commit:1"})
    cids = []
    for i in range(n):
        st, j = submit_until_answer(run, f"rf-{run.idx}-{i}",
                                    {"tool": "keyed_undeclared", "args": {"amount": 7}})
        cids.append(j["call_id"])
    wait_state(run, cids, "needs_review", "every call in review")
    old = {c: review_fence(run, c) for c in cids}
    run.fault("retry resolutions whose resend fails back into review")
    for c in cids:
        if review_cli(run, c, "--fence", str(old[c]), "--as", "retry", "--note", "resend"):
            run.fail(f"retry {c} refused")

    def back():
        return all(run.q(run.cdb, "SELECT state = 'NEEDS_REVIEW' AND fence <> ? FROM executions "
                                  "WHERE call_id = ?", (old[c], c))[0][0] for c in cids)
    run.wait(60, back, "every call back in review with another fence", supervise=True)
    time.sleep(run.rng.uniform(0.1, 1.0))
    for c in cids:
        before = run.q(run.cdb, "SELECT state, fence, (SELECT count(*) FROM audit WHERE "
                                "call_id = ?1) FROM executions WHERE call_id = ?1", (c,))
        rc = review_cli(run, c, "--fence", str(old[c]), "--as", "committed", "--ref", "pay_x",
                        "--note", "decided on the first episode")
        if rc != 9:
            run.fail(f"stale committed on {c}: exit {rc}, not 9 (review_moved)")
        after = run.q(run.cdb, "SELECT state, fence, (SELECT count(*) FROM audit WHERE "
                               "call_id = ?1) FROM executions WHERE call_id = ?1", (c,))
        if after != before:
            run.fail(f"a refused decision changed {c}: {before} -> {after}")
    ds_mode(run, {"faults": ""})
    for c in cids:
        if review_cli(run, c, "--fence", str(review_fence(run, c)), "--as", "retry", "--note",
                      "resend with the current fence"):
            run.fail(f"retry with the current fence refused for {c}")
    run.drain(60)
    wait_state(run, cids, "succeeded", "every call succeeded")
    for c in cids:
        if ledger_count(run, eid_of(c)) != 1:
            run.fail(f"{c}: {ledger_count(run, eid_of(c))} payments in the ledger")
    run.finish()


# --- real Kafka (row 7b, only with --real-kafka) ---------------------------------------------
KAFKA_NODES = (1, 2, 3)
KAFKA_TOPICS = ["onceq.tool-calls", "onceq.tool-results", "onceq.dlq"]
KAFKA_PARTITIONS = 6
REAL_KAFKA = {"kafka_node_faults"}  # scenarios that run on the real cluster (--real-kafka)


def kafka_missing(opts):
    """Why the real-Kafka scenarios cannot run on this machine (a sentence), or None. The jars
    are fetched with scripts/kafka-fetch.sh when they are not cached and Maven is there."""
    for tool, why in (("java", "Java 17+ runs the brokers (Debian: default-jre-headless)"),
                      ("kcat", "scripts/kafka-cluster.sh counts the brokers with it"),
                      ("ss", "scripts/kafka-cluster.sh picks free ports with it (iproute2)")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: {why}"
    try:
        r = subprocess.run(["java", "-XshowSettings:properties", "-version"],
                           capture_output=True, text=True, timeout=60)
        ver = [l.split("=", 1)[1].strip() for l in r.stderr.splitlines()
               if l.strip().startswith("java.specification.version")]
        if not ver or int(ver[0].split(".")[0]) < 17:
            return f"Java {ver[0] if ver else '?'} found; Kafka 4.1 needs 17 or newer"
    except (OSError, subprocess.TimeoutExpired, ValueError) as ex:
        return f"java does not run: {ex}"
    fetch = os.path.join(SRC, "scripts", "kafka-fetch.sh")
    if subprocess.run([fetch, "--check"], capture_output=True).returncode != 0:
        if shutil.which(os.environ.get("MVN", "mvn")) is None:
            return ("the Kafka jars are not fetched (scripts/kafka-fetch.sh) and Maven (mvn), "
                    "which fetches them, is not installed")
        print("fetching the Kafka jars (scripts/kafka-fetch.sh)", flush=True)
        try:
            r = subprocess.run([fetch], capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return "scripts/kafka-fetch.sh did not finish within 900 s"
        if r.returncode != 0:
            return f"scripts/kafka-fetch.sh failed: {r.stderr.strip()[-300:]}"
    if not os.access(os.path.join(opts.build, "oq_relay_check"), os.X_OK):
        return f"no oq_relay_check in {opts.build} (build the test tools)"
    return None


class KafkaCluster:
    """One 3-node KRaft cluster (scripts/kafka-cluster.sh) for every run of a real-Kafka
    scenario, in <results>/kafka. Nodes are signalled by the pids in their pid files, and a pid
    is trusted only while /proc/PID/cmdline names that node's server.properties (the script's
    rule). Every call is bounded."""

    def __init__(self, opts):
        self.opts = opts
        self.dir = os.path.join(opts.out, "kafka")
        self.bootfile = os.path.join(opts.out, "kafka.bootstrap")
        self.script = os.path.join(SRC, "scripts", "kafka-cluster.sh")
        self.bin = os.path.join(opts.build, "onceq")
        self.brokers = None
        self.seen_pids = {}  # pid -> node, every pid a node ever had (the final sweep)
        self.closing = threading.Event()
        os.makedirs(self.dir, exist_ok=True)
        self.log = open(os.path.join(opts.out, "kafka-runner.log"), "a")

    def say(self, msg):
        self.log.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
        self.log.flush()

    def sh(self, *args, timeout=120, quiet=False):
        """scripts/kafka-cluster.sh ARGS --dir D; (rc, stdout, stderr), rc 124 on timeout;
        logged to kafka-runner.log unless quiet (the polled status)."""
        argv = ["bash", self.script, *args, "--dir", self.dir]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
            rc, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as ex:
            rc, out, err = 124, ex.stdout or "", f"timed out after {timeout}s"
            out = out.decode() if isinstance(out, bytes) else out
        if not quiet or rc not in (0, 1):
            self.say(f"kafka-cluster.sh {' '.join(args)}: rc={rc} {err.strip()[-400:]}")
        return rc, out, err

    def start(self):
        rc, out, err = self.sh("start", "--nodes", str(len(KAFKA_NODES)), "--bootstrap-file",
                               self.bootfile, timeout=240)
        if rc != 0:
            raise RunFailed(f"the cluster did not start (rc {rc}): {err.strip()[-400:]}")
        with open(self.bootfile) as f:
            self.brokers = f.read().strip()
        for i in KAFKA_NODES:
            self.pid(i)

    def is_node(self, pid, i):
        """True while process pid is node i (its command line names its server.properties)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cl = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return f"kafka.Kafka {os.path.join(self.dir, f'node-{i}', 'server.properties')}" in cl

    def pid(self, i):
        """The live pid of node i from its pid file, or None."""
        try:
            with open(os.path.join(self.dir, f"node-{i}", "pid")) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return None
        if not self.is_node(pid, i):
            return None
        self.seen_pids[pid] = i
        return pid

    def state(self, i):
        """('running' | 'stopped' | 'dead', pid)."""
        pid = self.pid(i)
        if pid is None:
            return "dead", None
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "dead", None
        if st == "Z":
            return "dead", None
        return ("stopped" if st == "T" else "running"), pid

    def signal_node(self, i, sig):
        """kill-node I SIG (KILL waits until the process is gone)."""
        if self.closing.is_set():
            raise RunFailed("the cluster is being stopped")
        rc, _, err = self.sh("kill-node", str(i), sig, timeout=60)
        if rc != 0:
            raise RunFailed(f"kill-node {i} {sig}: rc {rc} {err.strip()[-200:]}")

    def start_node(self, i):
        """start-node I: on its data; waits until the metadata lists every broker (90 s)."""
        if self.closing.is_set():
            raise RunFailed("the cluster is being stopped")
        rc, _, err = self.sh("start-node", str(i), "--timeout", "90", timeout=150)
        self.pid(i)
        if rc != 0:
            raise RunFailed(f"start-node {i}: rc {rc} {err.strip()[-300:]}")

    def heal(self, say=None):
        """Every node running again: a stopped one continued, a dead one started on its data;
        returns what was done (empty when the cluster had every node running)."""
        acted = []
        for i in KAFKA_NODES:
            st, pid = self.state(i)
            if st == "stopped":
                os.kill(pid, signal.SIGCONT)
                acted.append(f"SIGCONT node {i}")
            elif st == "dead":
                self.start_node(i)
                acted.append(f"started node {i}")
        if acted:
            self.sh("wait-ready", "--timeout", "90", timeout=120)
            if say:
                say(f"kafka heal: {', '.join(acted)}")
        return acted

    def describe(self, topics=None, timeout_s=10, brokers=None):
        """`onceq topics describe --json`: {topic: its object}, or None when it failed."""
        argv = [self.bin, "topics", "describe", "--json", "--brokers", brokers or self.brokers,
                "--timeout", f"{timeout_s}s", *(topics or KAFKA_TOPICS)]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 10)
            return {t["name"]: t for t in json.loads(r.stdout)["topics"]}
        except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            return None

    def leaders(self, d, topics=None):
        return [p["leader"] for t in (topics or KAFKA_TOPICS) if d and t in d
                for p in d[t].get("partition_list", [])]

    def busiest(self):
        """The node leading most partitions of onceq.tool-calls (the lowest id on a tie)."""
        d = self.describe(["onceq.tool-calls"])
        led = [x for x in self.leaders(d, ["onceq.tool-calls"]) if x in KAFKA_NODES]
        if not led:
            return None
        return max(sorted(set(led)), key=led.count)

    def brokers_without(self, i):
        return ",".join(b for k, b in enumerate(self.brokers.split(","), 1) if k != i)

    def fenced(self, i, limit):
        """True when node i leads no partition of the onceq topics and every one has a leader.
        Asked of the two other nodes with a metadata request only (kcat -L: a stopped node
        would make requests to it wait, and `topics describe` also sends DescribeConfigs, which
        librdkafka may route to it), for at most limit seconds (the fault's remaining time)."""
        try:
            r = subprocess.run(["kcat", "-L", "-b", self.brokers_without(i), "-m", "3"],
                               capture_output=True, text=True, timeout=max(1, min(limit, 8)))
        except subprocess.TimeoutExpired:
            return False
        led, topic = [], None
        for line in r.stdout.splitlines():
            line = line.strip()
            if line.startswith("topic "):
                topic = line.split('"')[1] if '"' in line else None
            elif line.startswith("partition ") and topic in KAFKA_TOPICS:
                try:
                    led.append(int(line.split("leader ")[1].split(",")[0]))
                except (IndexError, ValueError):
                    return False
        return len(led) == len(KAFKA_TOPICS) * KAFKA_PARTITIONS and i not in led and \
            min(led) >= 0

    def whole(self, topics=True):
        """'' when the cluster is whole (3 nodes running, 3 brokers in the metadata and, with
        topics, every partition of the onceq topics led and fully replicated); else what is
        not."""
        bad = [f"node {i} {st}" for i in KAFKA_NODES for st in [self.state(i)[0]]
               if st != "running"]
        if bad:
            return ", ".join(bad)
        rc, out, _ = self.sh("status", timeout=30, quiet=True)
        n = [l.split(":", 1)[1].strip() for l in out.splitlines()
             if l.startswith("metadata brokers:")]
        if n != [str(len(KAFKA_NODES))]:
            return f"the metadata lists {n[0] if n and n[0] else '?'} brokers"
        if not topics:
            return ""
        # each broker asked on its own (the only one in the bootstrap list): a node just
        # resumed from SIGSTOP answers from its stale metadata for a moment, so all must agree
        for b, addr in enumerate(self.brokers.split(","), 1):
            d = self.describe(brokers=addr)
            if not d:
                return f"topics describe via node {b} failed"
            for t in KAFKA_TOPICS:
                x = d.get(t) or {}
                parts = x.get("partition_list", [])
                if not x.get("exists") or len(parts) != KAFKA_PARTITIONS:
                    return f"{t}: {len(parts)} partitions (via node {b})"
                short = [p["partition"] for p in parts
                         if p["leader"] < 0 or len(p.get("isr", [])) < len(KAFKA_NODES)]
                if x.get("under_replicated") or short:
                    return f"{t}: partitions {short} under-replicated (via node {b})"
        return ""

    def wait_whole(self, timeout, topics=True):
        """'' once whole within timeout seconds, else the last reason."""
        deadline = now() + timeout
        why = "not asked"
        while now() < deadline:
            why = self.whole(topics)
            if not why:
                return ""
            time.sleep(0.5)
        return why

    def recreate_topics(self, say):
        """The onceq topics deleted (with the group offsets on them) and created afresh: RF 3,
        min.insync.replicas 2, 6 partitions (as tests/integration/lib.sh does per script)."""
        r = subprocess.run([self.bin, "topics", "delete", "--if-exists", "--brokers",
                            self.brokers, "--timeout", "30s", *KAFKA_TOPICS],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RunFailed(f"topics delete: rc {r.returncode} {r.stderr.strip()[-300:]}")
        for attempt in range(5):  # a deletion can still be finishing on some broker
            r = subprocess.run([self.bin, "topics", "create", "--brokers", self.brokers,
                                "--partitions", str(KAFKA_PARTITIONS), "--replication-factor",
                                str(len(KAFKA_NODES)), "--min-insync-replicas", "2",
                                "--timeout", "30s"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                say(f"topics recreated (attempt {attempt + 1})")
                return
            time.sleep(2)
        raise RunFailed(f"topics create: rc {r.returncode} {r.stderr.strip()[-300:]}")

    def stop(self):
        """Every node stopped by its pid (the script: TERM, KILL after 10 s), then a sweep of
        every pid a node ever had (still that node: KILL)."""
        self.closing.set()
        if os.path.exists(os.path.join(self.dir, "cluster.env")):
            self.sh("stop", timeout=120)
        for _ in range(2):
            for pid, i in list(self.seen_pids.items()):
                if self.is_node(pid, i):
                    self.say(f"node {i} pid {pid} still running after stop: KILL")
                    try:
                        os.kill(pid, signal.SIGCONT)
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for i in KAFKA_NODES:  # a node started while the stop ran
                pid = self.pid(i)
                if pid:
                    self.say(f"node {i} pid {pid} running after stop: KILL")
                    os.kill(pid, signal.SIGKILL)
            time.sleep(1)
        self.log.close()


def sc_kafka_node_faults(run):
    """Row 7b, only with --real-kafka: the pipeline (producer, relay, 2-3 consumers with
    session.timeout.ms=6000 and a 3 s lease) on a real 3-node KRaft cluster (one cluster for
    every run; the onceq topics recreated per run, RF 3, min.insync.replicas 2, 6 partitions)
    while calls flow at 80/s; 1-3 faults drawn from the seed, one after the other (the cluster
    whole again in between): a node kill -9, restarted on its data 3-8 s later, or a node
    SIGSTOPped for 8-15 s (past the 6 s session timeouts), then SIGCONT; the node drawn at
    random or the one leading most partitions of onceq.tool-calls. Checks besides the usual:
    the cluster whole again within 60 s of the last fault's end (3 nodes, 3 brokers in the
    metadata, every partition led, none under-replicated); onceq.tool-calls holds every outbox row
    (oq_relay_check: nothing the brokers acknowledged was lost)."""
    k = run.opts.kafka
    chunk, rate = 480, 80  # the load runs in chunks of 6 s until the last fault healed
    plan = []
    nfaults = run.rng.randint(1, 3)
    for j in range(nfaults):
        kind = run.rng.choice(["kill", "stop"])
        if run.brk == "node_left_down" and j == nfaults - 1:
            kind = "kill"
        pick = run.rng.choice(["busiest", "random"])
        node = run.rng.randint(1, 3)  # the random pick; also busiest's stand-in without one
        secs = run.rng.uniform(3, 8) if kind == "kill" else run.rng.uniform(8, 15)
        plan.append((kind, pick, node, round(secs, 1), round(run.rng.uniform(1.0, 3.0), 1)))
    ncons = run.rng.randint(2, 3)
    run.say(f"plan {plan}, {ncons} consumers")
    run.metrics["plan"] = plan
    run.group = f"onceq-workers-{run.idx}"  # one cluster for every run: a group of its own
    abort = threading.Event()  # the main thread gave up: the fault thread heals and ends
    th = None
    interrupted = False
    try:
        acted = k.heal(run.say)  # an earlier run's failure may have left a node down
        if acted:
            run.note(f"before the run: {acted}")
        why = k.wait_whole(90, topics=False)  # the topics are recreated next
        if why:
            raise RunFailed(f"the cluster is not whole before the run: {why}")
        k.recreate_topics(run.say)
        run.brokers = k.brokers
        run.kafka_profile = "real"
        run.port = free_port()
        run.start_producer()
        run.start_relay()
        for i in range(1, ncons + 1):
            run.start_consumer(i)
        run.wait_healthy(30)
        run.wait(30, lambda: run.db_exists(run.cdb),
                 "consumer database", supervise=True)
        chunks = [0]

        def top_up():
            p = run.procs.get("load")
            if p is not None and p.poll() is None:
                return
            if p is not None and p.returncode != 0:
                run.fail(f"load chunk exit {p.returncode}")
            run.load(chunk, rate, "kf", conns=8, extra=("--first", str(chunks[0] * chunk)))
            chunks[0] += 1

        top_up()
        run.wait(90, lambda: top_up() or run.q(run.cdb, "SELECT count(*) FROM effects")[0][0]
                 > 0, "the first effects", supervise=True)
        done = threading.Event()
        result = {"faults": [], "error": None, "t_heal": None}

        def faults():
            try:
                for j, (kind, pick, node, secs, gap) in enumerate(plan):
                    if abort.wait(gap):
                        return
                    if pick == "busiest":
                        node = k.busiest() or node
                    d = k.describe()
                    led = sum(1 for x in k.leaders(d) if x == node)
                    rec = {"kind": kind, "pick": pick, "node": node, "secs": secs, "led": led}
                    t0 = now()
                    k.signal_node(node, "KILL" if kind == "kill" else "STOP")
                    run.fault(f"{'kill -9' if kind == 'kill' else 'SIGSTOP'} kafka node "
                              f"{node} (leads {led} partitions) for {secs} s")
                    while now() - t0 < secs and not abort.is_set():  # watch it fenced
                        if rec.get("fenced_after_s") is None and now() - t0 < secs - 1 \
                                and k.fenced(node, secs - (now() - t0)):
                            rec["fenced_after_s"] = round(now() - t0, 1)
                        time.sleep(0.5)
                    last = j == len(plan) - 1
                    if kind == "stop":
                        k.signal_node(node, "CONT")
                        run.say(f"SIGCONT kafka node {node}")
                    elif run.brk == "node_left_down" and last:
                        run.say(f"--break node_left_down: kafka node {node} not restarted")
                    else:
                        k.start_node(node)
                        run.say(f"kafka node {node} restarted on its data")
                    rec["healed_after_s"] = round(now() - t0, 1)
                    result["t_heal"] = now()
                    result["faults"].append(rec)
                    if not last and not abort.is_set():  # a second node down before the first caught up: 2 faults
                        why = k.wait_whole(90)
                        if why:
                            raise RunFailed(f"the cluster not whole 90 s after the fault on "
                                            f"node {node}: {why}")
            except Exception as ex:  # the main thread reports it
                result["error"] = ex
            finally:
                done.set()

        th = threading.Thread(target=faults, daemon=True)
        th.start()
        deadline = now() + 420
        while not done.is_set() and now() < deadline:
            run.supervise()
            top_up()
            time.sleep(0.1)
        run.metrics["faults"] = result["faults"]
        run.metrics["load_chunks"] = chunks[0]
        if not done.is_set():
            raise RunFailed("the faults did not end within 420 s")
        if result["error"] is not None:
            ex = result["error"]
            raise ex if isinstance(ex, RunFailed) else RunFailed(f"{type(ex).__name__}: {ex}")
        run.say(f"faults done: {result['faults']}")
        # after the faults the cluster is whole again, within 60 s of the last restart/SIGCONT
        t_h = result["t_heal"] or now()
        why = "not asked"
        while now() - t_h < 60:
            why = k.whole()
            if not why:
                run.metrics["whole_after_heal_s"] = round(now() - t_h, 1)
                run.say(f"cluster whole {now() - t_h:.1f} s after the last heal")
                break
            run.supervise()
            time.sleep(0.5)
        if why:
            run.fail(f"the cluster is not whole 60 s after the last fault ended: {why}")
        run.wait_load(120)
        run.drain(240)
        run.metrics["heal_to_drained_ms"] = round((now() - t_h) * 1000)
        acted = k.heal(run.say)  # whatever is still dead or stopped, before the checks
        if acted:
            run.note(f"at the end of the run: {acted}")
            why = k.wait_whole(60)
            if why:
                run.fail(f"the cluster not whole after restarting what was down: {why}")
        run.finish()
        r = subprocess.run([run.tool("oq_relay_check"), "--brokers", k.brokers, "--db", run.pdb,
                            "--topic", "onceq.tool-calls", "--timeout-ms", "60000"],
                           capture_output=True, text=True, timeout=120)
        summary = [l for l in r.stdout.splitlines() if l.startswith("# summary")]
        run.say(f"oq_relay_check rc={r.returncode} {summary} {r.stderr.strip()[-300:]}")
        fields = dict(x.split("=", 1) for x in (summary[0].split()[2:] if summary else [])
                      if "=" in x)
        run.metrics["topic_copies"] = int(fields.get("dups", -1))
        if r.returncode != 0 or fields.get("missing") != "0":
            run.fail(f"onceq.tool-calls against the outbox: rc {r.returncode}, "
                     f"{summary or r.stderr.strip()[-300:]}")
    except KeyboardInterrupt:
        interrupted = True  # Ctrl-C or TERM: no heal, the cluster is stopped next
        raise
    finally:
        abort.set()
        if th is not None:
            th.join(180)
            if th.is_alive():
                run.fail("the fault thread did not end within 180 s")
        if not interrupted:
            try:
                k.heal(run.say)  # the next run (and the final stop) find every node running
            except RunFailed as ex:
                run.note(f"heal after the run: {ex}")


# --- tasks (issue 19): runs of steps ----------------------------------------------------------
TASK_CRASH_POINTS = {
    "producer": ["producer.task_after_step_written", "producer.task_after_compensation_written",
                 "producer.task_after_checkpoint", "producer.after_commit_before_reply"],
    "consumer": ["consumer.after_request_sent_before_outcome",
                 "consumer.after_outcome_commit_before_offset"],
}


def task_post(run, key, body, tries=200):
    """One task submit, resent with the same key on transport errors, 429 and 5xx."""
    for _ in range(tries):
        try:
            st, j = http_json(run.port, "POST", "/v1/tasks", body, 5.0,
                              headers={"Idempotency-Key": key})
        except (OSError, http.client.HTTPException):
            run.supervise()  # a producer that died at its crash point is restarted here
            time.sleep(0.05)
            continue
        if st == 429 or st >= 500:
            time.sleep(0.1)
            continue
        return st, j
    raise RunFailed(f"task {key}: no definite answer after {tries} tries")


def task_body(run, i, decline):
    """3 steps, each payment with a reference of its own (t<run>.<i>-s<k>, compensations
    -u<k>), step 2 citing step 1's result; step 3 declined when \p decline."""
    r = f"t{run.idx}.{i}"
    return {"steps": [
        {"name": "s1", "tool": "step", "args": {"amount": 100 + i, "reference": f"{r}-s1"},
         "compensate": {"tool": "undo", "args": {
             "amount": "{steps.s1.result.response.amount}", "reference": f"{r}-u1"}}},
        {"name": "s2", "tool": "step",
         "args": {"amount": 2, "reference": f"{r}-s2 {{steps.s1.object_id}}"},
         "compensate": {"tool": "undo", "args": {"amount": 2, "reference": f"{r}-u2"}}},
        {"name": "s3", "tool": "step_decline" if decline else "step",
         "args": {"amount": 3, "reference": f"{r}-s3"}}]}


def task_tools(run, step_headers):
    return write_tools(run, [
        {"base": True, "name": "step", "body": "args",
         **({"headers": step_headers} if step_headers else {})},
        {"base": True, "name": "step_decline", "body": "args",
         "headers": {"X-Downstream-Fault": "decline"}},
        {"base": True, "name": "undo", "body": "args"}])


def tasks_open(run):
    return run.q(run.pdb, "SELECT count(*) FROM tasks WHERE status IN "
                          "('running','compensating')")[0][0]


def ledger_ref_dups(run):
    return run.q(run.ddb, "SELECT count(*) FROM (SELECT reference FROM payments "
                          "GROUP BY reference HAVING count(*) > 1)")[0][0]


def submit_tasks(run, n, decline_every, prefix, kills=None):
    """n tasks one after the other; kills: {i: process} killed -9 before task i."""
    errors = []
    for i in range(1, n + 1):
        if kills and i in kills:
            run.kill9(kills[i])
            run.supervise()
        st, j = task_post(run, f"{prefix}-{run.idx}-{i}",
                          task_body(run, i, decline_every and i % decline_every == 0))
        if st not in (200, 202):
            errors.append((i, st, j))
        run.supervise()
    if errors:
        run.fail(f"task submits refused: {errors[:3]}")


def drain_tasks(run, timeout):
    deadline = now() + timeout
    while now() < deadline:
        run.supervise()
        if tasks_open(run) == 0:
            return
        time.sleep(0.1)
    raise RunFailed(f"tasks not terminal within {timeout}s: {tasks_open(run)} open")


def check_task_ledger(run, n, decline_every):
    """Every task ended as expected; in the ledger every step and compensation once."""
    ends = dict(run.q(run.pdb, "SELECT status, count(*) FROM tasks GROUP BY status"))
    run.metrics["tasks"] = ends
    dups = ledger_ref_dups(run)
    run.metrics["task_ledger_dups"] = dups
    if dups:
        run.fail(f"{dups} step(s) or compensation(s) twice in the ledger")
    return ends


def sc_task_crash(run):
    """Row task_crash (issue 19): 3-step tasks (every 4th declined at step 3: steps 2 and 1
    compensated) while the producer and the consumer are armed at random task crash points
    (inside a step's or compensation's transaction, after a checkpoint, between steps, inside
    a step at the consumer) and killed at random moments; restarted unarmed. Every task
    terminal with the expected end; every step and compensation once in the ledger; verify's
    task invariants hold."""
    n = 40 if run.opts.smoke else 150
    start_downstream(run)
    tools = task_tools(run, None)
    pp = run.rng.choice(TASK_CRASH_POINTS["producer"])
    cp = run.rng.choice(TASK_CRASH_POINTS["consumer"])
    envs = {"producer": {"ONCEQ_CRASH_AT": f"{pp}@{run.rng.randint(2, 30)}"},
            "consumer-1": {"ONCEQ_CRASH_AT": f"{cp}@{run.rng.randint(2, 30)}"}}
    run.say(f"armed {envs}")
    run.start_pipeline(consumers=1, consumer_x=ds_consumer_x(tools), envs=envs)
    kills = {run.rng.randint(n // 4, n - 1): run.rng.choice(["producer", "consumer-1"])
             for _ in range(2)}
    submit_tasks(run, n, 4, "tc", kills)
    if run.brk == "task_restart":  # a resume from step 1 with new keys: must be caught
        for i in range(1, 6):
            submit_until_answer(run, f"naive-{run.idx}-{i}", {"tool": "step", "args": {
                "amount": 100 + i, "reference": f"t{run.idx}.{i}-s1"}})
    drain_tasks(run, 240)
    run.drain(120)
    ends = check_task_ledger(run, n, 4)
    want = {"succeeded": n - n // 4, "compensated": n // 4}
    if ends != want:
        run.fail(f"task ends {ends}, want {want}")
    run.finish()


def sc_task_crash_negative(run):
    """Negative control of task_crash: what a resume that restarts from step 1 (new keys, as an
    orchestrator without derived keys does) leaves: the same ledger check must see duplicates."""
    n = 10 if run.opts.smoke else 20
    start_downstream(run)
    tools = task_tools(run, None)
    run.start_pipeline(consumers=1, consumer_x=ds_consumer_x(tools))
    submit_tasks(run, n, 0, "tn")
    drain_tasks(run, 120)
    run.fault("resume from step 1 with new keys")
    for i in range(1, n + 1):
        submit_until_answer(run, f"naive-{run.idx}-{i}", {"tool": "step", "args": {
            "amount": 100 + i, "reference": f"t{run.idx}.{i}-s1"}})
    run.drain(120)
    dups = ledger_ref_dups(run)
    run.metrics["logical_dup_effects"] = dups
    run.say(f"ledger: {dups} steps twice after the naive resume")
    if dups < n:
        run.fail(f"negative control: the naive resume left {dups} duplicates for {n} tasks: "
                 f"the check is blind")
    run.finish()


def sc_compensation_failure(run):
    """Row compensation_failure (issue 19): tasks whose third step is declined, while the
    downstream declines 40-60 % of the compensations' requests (the steps carry
    X-Downstream-Fault: none): each compensation is retried as a new attempt of the same call
    with backoff, up to 4 attempts. Every task ends `compensated` (each compensation once in
    the ledger) or `needs_review` with the budget in its reason; none `compensated` with a
    compensation that did not succeed (verify's task_false_end)."""
    n = 20 if run.opts.smoke else 60
    start_downstream(run)
    tools = task_tools(run, {"X-Downstream-Fault": "none"})
    run.start_pipeline(consumers=1, consumer_x=ds_consumer_x(tools))
    rate = round(run.rng.uniform(0.4, 0.6), 2)
    ds_mode(run, {"faults": f"decline:{rate}"})
    run.fault(f"compensations declined at {rate}")
    submit_tasks(run, n, 1, "cf")
    drain_tasks(run, 240)
    run.drain(120)
    ends = check_task_ledger(run, n, 1)
    if set(ends) - {"compensated", "needs_review"} or sum(ends.values()) != n:
        run.fail(f"task ends {ends}")
    bad = run.q(run.pdb, "SELECT count(*) FROM tasks WHERE status = 'needs_review' AND reason "
                         "NOT LIKE '%retry budget%'")[0][0]
    if bad:
        run.fail(f"{bad} task(s) in review without the budget as reason")
    retries = run.q(run.pdb, "SELECT count(*) FROM audit WHERE event = "
                             "'task_compensation_retry'")[0][0]
    run.metrics["compensation_retries"] = retries
    if retries == 0:
        run.fail("no compensation was retried (the fault did not bite)")
    run.say(f"tasks {ends}, {retries} compensation retries")
    run.finish()


SCENARIOS = {
    "same_key": sc_same_key,
    "http_proxy": sc_http_proxy,
    "http_proxy_negative": sc_http_proxy_negative,
    "crash_points": sc_crash_points,
    "duplicate_delivery": sc_duplicate_delivery,
    "rebalance_storm": sc_rebalance_storm,
    "worker_stop": sc_worker_stop,
    "broker_faults": sc_broker_faults,
    "busy_storm": sc_busy_storm,
    "downstream_faults": sc_downstream_faults,
    "downstream_negative": sc_downstream_negative,
    "retry_payload": sc_retry_payload,
    "lost_messages": sc_lost_messages,
    "clock_step": sc_clock_step,
    "disk_full": sc_disk_full,
    "offset_rewind": sc_offset_rewind,
    "review_expiry": sc_review_expiry,
    "review_fence": sc_review_fence,
    "task_crash": sc_task_crash,
    "task_crash_negative": sc_task_crash_negative,
    "compensation_failure": sc_compensation_failure,
    "soak": sc_soak,  # only with --soak-minutes or when named
    "kafka_node_faults": sc_kafka_node_faults,  # only with --real-kafka (a 3-node cluster)
}
BREAKS = {  # --break NAME: a protection broken on purpose, so that a row's checks must fail
    "downstream_keys": "downstream_faults: the service behind pay_keys (declared idempotent) "
                       "ignores keys: its resends after unknown outcomes duplicate payments",
    "settle": "downstream_faults: pay_ref's lookup settle time 1 ms, under the slow fault's "
              "delay: a 'not found' is trusted while the request is still on its way",
    "clock_boottime": "clock_step: libfaketime steps CLOCK_MONOTONIC and CLOCK_BOOTTIME with "
                      "the wall clock, so the consumers' lease clock steps too: leases lapse "
                      "at once (review, or a resend while the first request lands)",
    "new_key": "retry_payload: the client resubmits with a new key: a second call and effect",
    "task_restart": "task_crash: after the kills, step 1 of five tasks is run again with new "
                    "keys (a resume that restarts from step 1): duplicates in the ledger",
    "redrive_off": "lost_messages: --redrive-after 0: lost messages are never repaired",
    "no_space_return": "disk_full: the space never returns: the calls cannot be accepted",
    "rewind_session": "offset_rewind: the rewinding tool keeps librdkafka's 45 s session "
                      "timeout (what the first attempt did): measures how long the group then "
                      "waits before the restarted consumers get partitions",
    "soak_tight": "soak: no growth tolerated at all (1.0x + 0 KiB, +0 descriptors): the "
                  "normal warm-up of a daemon must then count as growth",
    "node_left_down": "kafka_node_faults: the last fault is a kill -9 whose node is not "
                      "restarted: the cluster-whole check must fail (the node is started "
                      "after the checks, for the next run)",
}
MISSING = {  # issue 13 rows not run here, and why
    "offset_rewind (4c)": "see docs/CHAOS.md, 'Offset rewind'",
}
MISSING_WITHOUT_KAFKA = {  # added to the report when the real-Kafka row was not selected
    "kafka_node_faults (7b)": "node kill -9 / restart and SIGSTOP of a real Kafka broker: "
                              "only with --real-kafka (make chaos-matrix-kafka), which starts "
                              "a 3-node KRaft cluster",
}


# --- report ----------------------------------------------------------------------------------
def row_of(name, runs):
    rec = [r.metrics["recovery_ms"] for r in runs if r.metrics.get("recovery_ms") is not None]
    s = lambda k: sum(int(r.metrics.get(k) or 0) for r in runs)
    calls = s("calls")
    dup = s("duplicate_effects")
    row = {
        "scenario": name, "runs": len(runs), "passed": sum(1 for r in runs if not r.failures),
        "calls": calls, "inbox_duplicates": s("inbox_duplicates"), "duplicate_effects": dup,
        "lost": s("lost"), "dsr": (dup / calls) if calls else 0.0,
        "recovery_ms": rec, "p50_ms": pct(rec, 50), "p95_ms": pct(rec, 95),
        "p99_ms": pct(rec, 99),
        "failures": [f"run {r.idx}: {f}" for r in runs for f in r.failures],
        "notes": [f"run {r.idx}: {n}" for r in runs for n in r.notes],
        "seeds": [r.seed_str for r in runs],
        "details": [dict(r.metrics, run=r.idx) for r in runs],
    }
    if name in ("http_proxy_negative", "downstream_negative", "task_crash_negative"):
        row["control_duplicates"] = s("logical_dup_effects")
    if any("downstream_dups" in r.metrics for r in runs):
        row["downstream_duplicates"] = s("downstream_dups")
    if name == "http_proxy":
        row["logical_duplicates"] = s("logical_dup_effects")
    return row


def skipped_row(name, reason):
    """A scenario that could not run here: reported as skipped, with the reason, never as
    passed."""
    return {"scenario": name, "runs": 0, "passed": 0, "calls": 0, "inbox_duplicates": 0,
            "duplicate_effects": 0, "lost": 0, "dsr": 0.0, "recovery_ms": [], "p50_ms": None,
            "p95_ms": None, "p99_ms": None, "failures": [], "notes": [f"skipped: {reason}"],
            "seeds": [], "details": [], "skipped": reason}


def fmt_ms(v):
    return "-" if v is None else f"{v / 1000:.2f}"


def table_md(rows):
    out = ["| scenario | runs | pass | calls | dup absorbed (inbox) | dup effects | lost | DSR |"
           " recovery p50 s | p95 s | p99 s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.get("skipped"):
            out.append(f"| {r['scenario']} | 0 | skipped: {r['skipped']} | - | - | - | - | - |"
                       f" - | - | - |")
            continue
        dup = str(r["duplicate_effects"])
        if "control_duplicates" in r:
            where = " in the ledger" if r["scenario"] == "downstream_negative" else ""
            dup = (f"{r['duplicate_effects']} (control: {r['control_duplicates']} extra "
                   f"effects{where})")
        elif "downstream_duplicates" in r:
            dup = f"{r['duplicate_effects']} (ledger: {r['downstream_duplicates']})"
        out.append(f"| {r['scenario']} | {r['runs']} | {r['passed']} | {r['calls']} | "
                   f"{r['inbox_duplicates']} | {dup} | {r['lost']} | {r['dsr']:.4f} | "
                   f"{fmt_ms(r['p50_ms'])} | {fmt_ms(r['p95_ms'])} | {fmt_ms(r['p99_ms'])} |")
    return "\n".join(out)


def svg_chart(rows, seed):
    """Recovery times per scenario: a dot per run, a bar from p50 to p95, a tick at p99."""
    rows = [r for r in rows if r["recovery_ms"]]
    w, left, right, top, rh = 760, 190, 30, 50, 28
    h = top + rh * max(1, len(rows)) + 50
    vmax = max([max(r["recovery_ms"]) for r in rows] + [1000]) / 1000.0
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300) if vmax / s <= 8)
    vmax = step * (int(vmax / step) + 1)
    x = lambda v: left + (w - left - right) * (v / 1000.0) / vmax
    e = []
    e.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="12">')
    e.append(f'<rect width="{w}" height="{h}" fill="white"/>')
    e.append(f'<text x="{left}" y="20" font-size="14" font-weight="bold">onceq chaos matrix: '
             f'recovery time (last fault to all calls terminal), seed {seed}</text>')
    e.append(f'<text x="{left}" y="36" fill="#555">dots: runs; bar: p50..p95; black tick: '
             f'p99</text>')
    yb = top + rh * len(rows)
    t = 0
    while t <= vmax + 1e-9:
        xt = x(t * 1000)
        e.append(f'<line x1="{xt:.1f}" y1="{top - 4}" x2="{xt:.1f}" y2="{yb}" stroke="#ddd"/>')
        e.append(f'<text x="{xt:.1f}" y="{yb + 16}" text-anchor="middle">{t:g}</text>')
        t += step
    e.append(f'<text x="{(left + w - right) / 2:.0f}" y="{yb + 34}" text-anchor="middle">'
             f'seconds</text>')
    for i, r in enumerate(rows):
        y = top + rh * i + rh / 2
        e.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{r["scenario"]}'
                 f'</text>')
        e.append(f'<rect x="{x(r["p50_ms"]):.1f}" y="{y - 7:.1f}" '
                 f'width="{max(2, x(r["p95_ms"]) - x(r["p50_ms"])):.1f}" height="14" '
                 f'fill="#9cc3e6" stroke="#2b6cb0"/>')
        e.append(f'<line x1="{x(r["p99_ms"]):.1f}" y1="{y - 10:.1f}" x2="{x(r["p99_ms"]):.1f}" '
                 f'y2="{y + 10:.1f}" stroke="black" stroke-width="2"/>')
        for v in r["recovery_ms"]:
            e.append(f'<circle cx="{x(v):.1f}" cy="{y:.1f}" r="3" fill="#c0392b" '
                     f'fill-opacity="0.7"/>')
    e.append("</svg>")
    return "\n".join(e) + "\n"


def run_scenario(opts, name, t0):
    """The runs of one scenario; returns (runs, stopped by the time budget)."""
    runs = []
    for i in range(1, opts.runs + 1):
        if opts.minutes and now() - t0 > opts.minutes * 60:
            return runs, True
        run = Run(opts, name, i, opts.seed)
        ts = now()
        try:
            SCENARIOS[name](run)
        except RunFailed as ex:
            run.fail(str(ex))
        except Exception as ex:  # a bug in the scenario is a failed run, with its trace
            import traceback
            run.fail(f"{type(ex).__name__}: {ex}")
            run.log.write(traceback.format_exc())
        finally:
            run.stop_all()
            for c in run.cleanups:
                c()
        status = "ok" if not run.failures else "FAIL"
        print(f"  {name} run {i}/{opts.runs}: {status} ({now() - ts:.1f}s, calls "
              f"{run.metrics.get('calls', '?')}, recovery "
              f"{fmt_ms(run.metrics.get('recovery_ms'))} s)"
              + ("" if not run.failures else
                 f"\n    failures: {run.failures}\n    reproduce: chaos/run.py --seed "
                 f"{opts.seed} --scenarios {name} --runs {i} --keep"
                 + (" --db pg" if opts.db == "pg" else "")
                 + (" --real-kafka" if name in REAL_KAFKA else "")
                 + (f" --break {opts.brk}" if name in REAL_KAFKA and opts.brk else "")
                 + f"\n    folder: {run.dir}"),
              flush=True)
        runs.append(run)
        if not run.failures and not opts.keep:
            subprocess.run(["rm", "-rf", run.dir])
            if run.pg_name:
                opts.pg.drop(run.pg_name)
        run.log.close()
    return runs, False


def run_on_kafka(opts, name, t0):
    """The runs of a real-Kafka scenario on one cluster started for them, stopped (every node
    by its pid) when they end, also on a failure, Ctrl-C or SIGTERM. The cluster's folder
    (node logs) stays when a run failed or with --keep."""
    opts.kafka = cluster = KafkaCluster(opts)

    def term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = signal.signal(signal.SIGTERM, term)
    runs, early = [], False
    try:
        print(f"  {name}: starting a 3-node Kafka cluster in {cluster.dir}", flush=True)
        ts = now()
        try:
            cluster.start()
            print(f"  {name}: cluster up at {cluster.brokers} ({now() - ts:.0f}s)", flush=True)
            runs, early = run_scenario(opts, name, t0)
        except RunFailed as ex:
            run = Run(opts, name, 1, opts.seed)
            run.fail(f"kafka cluster: {ex}")
            run.log.close()
            print(f"  {name}: FAIL: {ex}\n    folder: {cluster.dir}", flush=True)
            runs = [run]
    finally:
        print(f"  {name}: stopping the Kafka cluster (by pid)", flush=True)
        cluster.stop()
        opts.kafka = None
        signal.signal(signal.SIGTERM, old)
    if runs and not opts.keep and all(not r.failures for r in runs):
        subprocess.run(["rm", "-rf", cluster.dir])
    return runs, early


def main():
    ap = argparse.ArgumentParser(description="onceq chaos matrix runner")
    ap.add_argument("--scenarios", default="all")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--minutes", type=float, default=0,
                    help="time budget: no new run starts after M minutes (0: none)")
    ap.add_argument("--out", default=None, help="results folder (default results/<stamp>)")
    ap.add_argument("--build", default=os.environ.get("ONCEQ_BUILD", os.path.join(SRC, "build")))
    ap.add_argument("--smoke", action="store_true", help="smaller loads (the smoke test)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (databases, logs)")
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("--soak-minutes", type=float, default=0,
                    help="add the soak: M minutes of load with a kill -9 every 2-6 s, RSS and "
                         "descriptors sampled (named alone, `--scenarios soak` runs 0.5 min)")
    ap.add_argument("--break", dest="brk", default=None,
                    help="break one protection on purpose to watch a row fail (see "
                         "docs/CHAOS.md): " + ", ".join(BREAKS))
    ap.add_argument("--real-kafka", action="store_true",
                    help="add the real-Kafka row (kafka_node_faults, 7b): one 3-node KRaft "
                         "cluster (scripts/kafka-cluster.sh) for all its runs; needs java 17+, "
                         "kcat and the jars of scripts/kafka-fetch.sh (fetched with mvn when "
                         "missing), else the row is reported as skipped (exit 77)")
    ap.add_argument("--db", choices=("sqlite", "pg"), default="sqlite",
                    help="where the stages keep their state: SQLite files (default) or "
                         "PostgreSQL, a fresh database per run (rows that test SQLite itself "
                         "are skipped)")
    ap.add_argument("--pg-url", default=None,
                    help="--db pg: the server (a URI whose password is in a passfile; default "
                         "ONCEQ_TEST_PG_URL, else a private cluster by scripts/pg.sh)")
    ap.add_argument("--pg-stages", default="producer,relay,consumer",
                    help="--db pg: the stages on PostgreSQL (producer,relay[,consumer]); the "
                         "others keep SQLite files")
    ap.add_argument("--list", action="store_true")
    opts = ap.parse_args()
    opts.pg = None
    opts.kafka = None
    if opts.list:
        for n, f in SCENARIOS.items():
            print(f"{n}: {' '.join(f.__doc__.split())}")
        for n, why in MISSING.items():
            print(f"(missing) {n}: {why}")
        return 0
    names = ([n for n in SCENARIOS if n != "soak" and (opts.real_kafka or n not in REAL_KAFKA)]
             if opts.scenarios == "all" else opts.scenarios.split(","))
    if opts.soak_minutes and "soak" not in names:
        names.append("soak")
    bad = [n for n in names if n not in SCENARIOS]
    if bad or opts.runs < 1:
        print(f"unknown scenario(s) {bad}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    need = [n for n in names if n in REAL_KAFKA]
    if need and not opts.real_kafka:
        print(f"{', '.join(need)} run(s) on a real Kafka cluster: add --real-kafka",
              file=sys.stderr)
        return 2
    if opts.seed is None:
        opts.seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {opts.seed}", flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    opts.out = os.path.abspath(opts.out or os.path.join(SRC, "results", stamp))
    os.makedirs(opts.out, exist_ok=True)
    if not os.access(os.path.join(opts.build, "onceq"), os.X_OK):
        print(f"no onceq binary in {opts.build} (build first)", file=sys.stderr)
        return 2
    if opts.db == "pg":
        try:
            opts.pg = PgServer(opts)
        except (RuntimeError, PgError, OSError, subprocess.SubprocessError) as ex:
            print(f"--db pg: no PostgreSQL server: {ex}", file=sys.stderr)
            return 2
        print(f"PostgreSQL: stages {opts.pg_stages} on a fresh database per run", flush=True)
    try:
        return run_all(opts, names)
    finally:
        if opts.pg:
            opts.pg.stop()


def run_all(opts, names):
    t0 = now()
    rows = []
    stopped_early = False
    for name in names:
        if opts.db == "pg" and name in PG_SKIP:  # not applicable: listed under "Not run here"
            print(f"  {name}: not run on PostgreSQL: {PG_SKIP[name]}", flush=True)
            continue
        if name in REAL_KAFKA:
            if opts.minutes and now() - t0 > opts.minutes * 60:
                stopped_early = True  # no cluster start past the budget
                continue
            why = kafka_missing(opts)
            if why:
                print(f"  {name}: SKIPPED: {why}", flush=True)
                rows.append(skipped_row(name, why))
                continue
            runs, early = run_on_kafka(opts, name, t0)
        else:
            runs, early = run_scenario(opts, name, t0)
        stopped_early = stopped_early or early
        if runs:
            rows.append(row_of(name, runs))
    elapsed = now() - t0
    md = table_md(rows) + soak_md(rows)
    print()
    print(md)
    ok = all(not r["failures"] for r in rows) and not stopped_early
    skipped = {r["scenario"]: r["skipped"] for r in rows if r.get("skipped")}
    verdict = "FAIL" if not ok else "SKIP" if skipped else "PASS"  # a skip never passes
    missing = dict(MISSING)
    if not any(n in REAL_KAFKA for n in names):
        missing.update(MISSING_WITHOUT_KAFKA)
    if opts.db == "pg":
        missing.update({f"{n} (--db pg)": why for n, why in PG_SKIP.items() if n in names})
    report = {"seed": opts.seed, "runs_per_scenario": opts.runs, "smoke": opts.smoke,
              "db": opts.db, "pg_stages": opts.pg_stages if opts.db == "pg" else None,
              "elapsed_s": round(elapsed, 1), "cpus": os.cpu_count(),
              "passed": ok and not skipped, "verdict": verdict, "skipped": skipped,
              "stopped_by_time_budget": stopped_early, "rows": rows, "missing": missing}
    with open(os.path.join(opts.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(opts.out, "report.md"), "w") as f:
        f.write(f"# onceq chaos matrix\n\nseed {opts.seed}, {opts.runs} run(s) per scenario"
                f"{' on PostgreSQL (' + opts.pg_stages + ')' if opts.db == 'pg' else ''}"
                f"{' (smoke sizes)' if opts.smoke else ''}, {elapsed / 60:.1f} min on "
                f"{os.cpu_count()} CPUs; {verdict}\n\n{md}\n")
        for r in rows:
            for x in r["failures"]:
                f.write(f"\n- FAIL {r['scenario']} {x}")
        for n, why in skipped.items():
            f.write(f"\n- SKIPPED {n}: {why}")
        f.write("\n\nNot run here:\n\n" + "\n".join(f"- {k}: {v}" for k, v in missing.items())
                + "\n")
    with open(os.path.join(opts.out, "recovery.svg"), "w") as f:
        f.write(svg_chart(rows, opts.seed))
    print(f"\n{verdict} in {elapsed:.0f}s; seed {opts.seed}; results in {opts.out}")
    for r in rows:
        for x in r["failures"]:
            print(f"FAIL {r['scenario']} {x}")
    for n, why in skipped.items():
        print(f"SKIPPED {n}: {why}")
    if stopped_early:
        print(f"stopped by the time budget ({opts.minutes} min): not every run ran")
    return 1 if not ok else 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
