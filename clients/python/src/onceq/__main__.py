# SPDX-License-Identifier: Apache-2.0
"""python3 -m onceq fingerprint --tool T [--tenant X] < args.json | canon < any.json
| call --key K --tool T --args JSON [--url U] [--tenant X] [--timeout S]"""
import argparse
import json
import sys
from typing import List, Optional

from . import Client, IdempotencyConflict, OnceqError, canonicalize, fingerprint, parse_strict


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="onceq-client", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fingerprint")
    f.add_argument("--tool", required=True)
    f.add_argument("--tenant", default="default")
    sub.add_parser("canon")
    c = sub.add_parser("call")
    c.add_argument("--url", default=None)
    c.add_argument("--key", required=True)
    c.add_argument("--tool", required=True)
    c.add_argument("--args", required=True)
    c.add_argument("--tenant", default=None)
    c.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    try:
        text = a.args if a.cmd == "call" else sys.stdin.buffer.read().decode("utf-8")
        v = parse_strict(text)
        if a.cmd == "canon":
            sys.stdout.write(canonicalize(v))
            return 0
        if not isinstance(v, dict):
            raise ValueError("args must be a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        print("onceq-client: invalid input: %s" % e, file=sys.stderr)
        return 2
    if a.cmd == "fingerprint":
        print(fingerprint(a.tenant, a.tool, v))
        return 0
    try:
        call = Client(a.url).call(a.tool, v, key=a.key, tenant=a.tenant, timeout=a.timeout)
    except IdempotencyConflict as e:
        print("onceq-client: %s" % e, file=sys.stderr)
        return 5
    except OnceqError as e:
        print("onceq-client: %s" % e, file=sys.stderr)
        return 1
    print(json.dumps(call.raw, ensure_ascii=False, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
