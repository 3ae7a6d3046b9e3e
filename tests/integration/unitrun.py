#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""unitrun: a stand-in for `systemctl` where systemd is not PID 1 (containers, CI).

It starts a unit's ExecStart= the way systemd would for the settings onceq's units use, and
nothing more: a clean environment; Environment= then EnvironmentFile= (files override,
`-` = optional); LoadCredential=ID:PATH copied into a private credentials directory
($CREDENTIALS_DIRECTORY, %d); the specifiers %i %I %n %N %H %d %%; ${VAR} and $VAR in
ExecStart= from that environment; StateDirectory= created; Type=notify waits for READY=1 on
$NOTIFY_SOCKET within TimeoutStartSec (90 s), and a process that exits first fails the start.
It does NOT apply User=, the sandboxing settings or the seccomp filter (they need PID 1 and
privileges); systemd-analyze checks those (integration.test_service_units).

Absolute paths under /etc/ and /var/lib/ (in EnvironmentFile=, LoadCredential=, Environment=
values and StateDirectory=) are moved under $UNITRUN_ROOT, so a test runs the units as
installed without writing to the host's /etc or /var/lib.

  UNITRUN_DIR=D UNITRUN_ROOT=R unitrun.py link UNITFILE... | daemon-reload |
      enable --now UNIT... | start UNIT... | stop UNIT... | is-active UNIT | pid UNIT

State in D: links, <unit>.pid, <unit>.log (stdout+stderr), credentials/<unit>/.
"""
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

D = os.environ["UNITRUN_DIR"]
ROOT = os.environ["UNITRUN_ROOT"]
SEARCH = [p for p in os.environ.get("UNITRUN_PATH", "").split(":") if p]


def die(msg):
    print("unitrun: " + msg, file=sys.stderr)
    sys.exit(1)


def relocate(v):
    for top in ("/etc/", "/var/lib/"):
        if v.startswith(top):
            return ROOT + v
    return v


def find_unit(name):
    """(path, instance) of UNIT; a template onceq-x@.service serves onceq-x@N.service."""
    m = re.match(r"^(.*)@(.*)\.service$", name)
    base = m.group(1) + "@.service" if m else name
    links = os.path.join(D, "links")
    cands = []
    if os.path.exists(links):
        cands += [line.strip() for line in open(links) if line.strip()]
    for f in cands:
        if os.path.basename(f) == base:
            return f, (m.group(2) if m else "")
    for d in SEARCH:
        if os.path.exists(os.path.join(d, base)):
            return os.path.join(d, base), (m.group(2) if m else "")
    die("unit %s not found" % name)


def parse(path):
    """The [Service] section as a list of (key, value), continuation lines joined."""
    out, sect, cont = [], None, ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if cont:
            line, cont = cont + line.lstrip(), ""
        if line.endswith("\\"):
            cont = line[:-1] + " "
            continue
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            sect = s
            continue
        if sect == "[Service]" and "=" in s:
            k, v = s.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out


def specifiers(v, name, inst, cred):
    table = {"i": inst, "I": inst, "n": name, "N": name[:-len(".service")],
             "H": socket.gethostname(), "d": cred, "%": "%"}
    return re.sub(r"%(.)", lambda m: table.get(m.group(1), m.group(0)), v)


def env_file(path, env):
    optional = path.startswith("-")
    path = relocate(path.lstrip("-"))
    if not os.path.exists(path):
        if optional:
            return
        die("EnvironmentFile %s does not exist" % path)
    for line in open(path):
        s = line.strip()
        if not s or s[0] in "#;" or "=" not in s:
            continue
        k, v = s.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        env[k.strip()] = v


def expand_vars(arg, env):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: env.get(m.group(1) or m.group(2), ""), arg)


def start(name):
    if is_active(name):
        return
    path, inst = find_unit(name)
    cred = os.path.join(D, "credentials", name)
    opts = parse(path)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8"}
    files, argv, notify, creds = [], None, False, []
    for k, v in opts:
        v = specifiers(v, name, inst, cred)
        if k == "Environment":
            for a in shlex.split(v):
                ek, ev = a.split("=", 1)
                env[ek] = relocate(ev)
        elif k == "EnvironmentFile":
            files.append(v)
        elif k == "LoadCredential":
            cid, src = v.split(":", 1)
            creds.append((cid, relocate(src)))
        elif k == "StateDirectory":
            for sd in v.split():
                os.makedirs(os.path.join(ROOT, "var/lib", sd), mode=0o750, exist_ok=True)
        elif k == "Type":
            notify = v == "notify"
        elif k == "ExecStart":
            argv = v
    for f in files:  # EnvironmentFile= overrides Environment=, whatever the order
        env_file(f, env)
    if creds:
        os.makedirs(cred, mode=0o700, exist_ok=True)
        for cid, src in creds:
            if not os.path.exists(src):
                die("%s: LoadCredential %s: %s does not exist" % (name, cid, src))
            dst = os.path.join(cred, cid)
            with open(src, "rb") as i, open(dst, "wb") as o:
                o.write(i.read())
            os.chmod(dst, 0o400)
        env["CREDENTIALS_DIRECTORY"] = cred
    if not argv:
        die("%s has no ExecStart=" % name)
    args = [expand_vars(a, env) for a in shlex.split(argv.lstrip("-@+!:"))]
    sock = None
    if notify:
        spath = os.path.join(D, name + ".notify")
        if os.path.exists(spath):
            os.unlink(spath)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(spath)
        env["NOTIFY_SOCKET"] = spath
    log = open(os.path.join(D, name + ".log"), "ab")
    p = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         cwd="/", start_new_session=True)
    with open(os.path.join(D, name + ".pid"), "w") as f:
        f.write("%d\n" % p.pid)
    if not notify:
        return
    sock.settimeout(0.2)
    deadline = time.time() + 90
    while time.time() < deadline:
        if p.poll() is not None:
            die("%s exited with status %d before READY=1 (log: %s.log)" % (name, p.returncode,
                                                                         name))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            continue
        if "READY=1" in msg.split("\n"):
            sock.close()
            print("unitrun: started %s (pid %d)" % (name, p.pid))
            return
    p.kill()
    die("%s: no READY=1 within 90 s" % name)


def pid_of(name):
    try:
        return int(open(os.path.join(D, name + ".pid")).read())
    except (OSError, ValueError):
        return 0


def is_active(name):
    pid = pid_of(name)
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop(name):
    pid = pid_of(name)
    if not pid or not is_active(name):
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(900):  # TimeoutStopSec=90s
        if not is_active(name):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def main(argv):
    os.makedirs(D, exist_ok=True)
    if not argv:
        die("usage: unitrun.py link|daemon-reload|enable --now|start|stop|is-active|pid ...")
    cmd, rest = argv[0], argv[1:]
    if cmd == "link":
        with open(os.path.join(D, "links"), "a") as f:
            for u in rest:
                f.write(os.path.abspath(u) + "\n")
    elif cmd == "daemon-reload":
        pass
    elif cmd in ("enable", "start"):
        units = [u for u in rest if not u.startswith("-")]
        if cmd == "enable" and "--now" not in rest:
            return 0
        for u in units:
            start(u if u.endswith(".service") else u + ".service")
    elif cmd == "stop":
        for u in rest:
            stop(u if u.endswith(".service") else u + ".service")
    elif cmd == "is-active":
        return 0 if is_active(rest[0]) else 3
    elif cmd == "pid":
        print(pid_of(rest[0]))
    else:
        die("unknown command " + cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
