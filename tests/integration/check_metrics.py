# SPDX-License-Identifier: Apache-2.0
"""Checks Prometheus text exposition with the reference parser (prometheus_client).

usage: check_metrics.py COMPONENT FIRST.prom SECOND.prom [REQUIRED_FAMILY ...]

FIRST and SECOND are two scrapes of one process, SECOND taken later. Checks: both parse; every
counter is named *_total and no other type is; onceq_build_info{version,component=COMPONENT} 1;
the standard process_* metrics; every counter sample of FIRST is <= its value in SECOND
(counters only grow); every REQUIRED_FAMILY (a sample name, optionally with one label as
name{label}) is present in SECOND. Exit 0 when all hold, 1 with one line per failure.
"""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

PROCESS = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
]


def parse(path):
    text = open(path, encoding="utf-8").read()
    fams = list(text_string_to_metric_families(text))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = {}
    for f in fams:
        for s in f.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = (f.type, s.value)
    return fams, types, samples


def main():
    comp, first, second, required = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    errors = []
    _, _, s1 = parse(first)
    fams, types, s2 = parse(second)
    for name, typ in types.items():
        if typ == "counter" and not name.endswith("_total"):
            errors.append(f"counter {name} does not end in _total")
        if typ != "counter" and name.endswith("_total"):
            errors.append(f"{typ} {name} ends in _total (only counters may)")
    info = [(labels, v) for (n, labels), (_, v) in s2.items() if n == "onceq_build_info"]
    if len(info) != 1 or info[0][1] != 1:
        errors.append(f"onceq_build_info: expected one sample of value 1, got {info}")
    else:
        labels = dict(info[0][0])
        if not labels.get("version") or labels.get("component") != comp:
            errors.append(f"onceq_build_info labels {labels} (component should be {comp})")
    names = {n for (n, _) in s2}
    for p in PROCESS:
        if p not in names:
            errors.append(f"{p} missing")
    for key, (typ, v1) in s1.items():
        if typ != "counter" or not key[0].endswith("_total"):
            continue
        if key in s2 and s2[key][1] < v1:
            errors.append(f"counter {key[0]}{dict(key[1])} went down: {v1} -> {s2[key][1]}")
    for r in required:
        m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(\w+)\})?", r)
        name, label = m.group(1), m.group(2)
        if not any(n == name and (not label or label in dict(ls)) for (n, ls) in s2):
            errors.append(f"required {r} missing")
    for e in errors:
        print(f"{second}: {e}")
    if not errors:
        print(f"{second}: {len(fams)} families, {len(s2)} samples: ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
