# SPDX-License-Identifier: Apache-2.0
"""RFC 8785 (JCS) canonical JSON and onceq's call fingerprint, exactly as `onceq fingerprint`."""
import hashlib
import json
import math
from typing import Any, Dict, Iterable, Tuple

MAX_SAFE_INT = 2**53



def _number(x: float) -> str:
    """ECMAScript Number.prototype.toString of a double (RFC 8785 section 3.2.2.3), with
    onceq's limits: integers within +-2^53, and no integral double in (2^53, 1e21), which
    would print as an integer that no strict reader takes back."""
    if isinstance(x, int):
        if abs(x) > MAX_SAFE_INT:
            raise ValueError("integer %d is outside +-2^53 (RFC 8785 numbers are doubles)" % x)
        return str(x)
    if not math.isfinite(x):
        raise ValueError("%r is not a JSON number" % x)
    if x == 0:
        return "0"  # also -0
    if MAX_SAFE_INT < abs(x) < 1e21:
        raise ValueError("number %r is an integer outside +-2^53" % x)
    # repr() is the shortest string that round-trips (as ECMAScript's), in Python's layout:
    # take its digits and the position of the decimal point, then lay them out as ECMA-262 does
    mant, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mant.partition(".")
    every = whole + frac
    digits = every.lstrip("0")
    n = len(whole) + int(exp or 0) - (len(every) - len(digits))  # value = 0.DIGITS x 10^n
    digits = digits.rstrip("0")
    k = len(digits)
    sign = "-" if x < 0 else ""
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    frac = "." + digits[1:] if k > 1 else ""
    return sign + digits[0] + frac + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def _string(s: str) -> str:
    s.encode("utf-8")  # a lone surrogate is not Unicode text: raises
    # json.dumps escapes exactly what RFC 8785 escapes: " \ and U+0000..U+001F (\b \f \n \r \t
    # short, the others as \u00xx in lowercase hex); ensure_ascii=False keeps the rest as is
    return json.dumps(s, ensure_ascii=False)


def canonicalize(v: Any) -> str:
    """The RFC 8785 canonical JSON text of a value made of dict, list, str, int, float, bool,
    None."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return _number(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(canonicalize(x) for x in v) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValueError("object keys must be strings")
        keys = sorted(v, key=lambda k: k.encode("utf-16-be", "strict"))  # UTF-16 code units
        return "{" + ",".join(_string(k) + ":" + canonicalize(v[k]) for k in keys) + "}"
    raise ValueError("not a JSON value: %r" % type(v))


def fingerprint(tenant: str, tool: str, args: Any) -> str:
    """onceq's call fingerprint: SHA-256 hex of the RFC 8785 form of {args, tenant, tool}."""
    text = canonicalize({"args": args, "tenant": tenant, "tool": tool})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _no_duplicates(pairs: Iterable[Tuple[str, Any]]) -> Dict[str, Any]:
    d: Dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate member %r" % k)
        d[k] = v
    return d


def _float(text: str) -> float:
    x = float(text)
    if math.isinf(x):
        raise ValueError("number %s is too large for a double" % text)
    if x == 0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise ValueError("number %s is too small for a double and would read as 0" % text)
    return x


def _bad_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


def parse_strict(text: str) -> Any:
    """json.loads with onceq's rules: no duplicate member, no NaN/Infinity, no number that a
    double cannot hold (over- or underflow), integers within +-2^53."""
    v = json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_float,
                   parse_constant=_bad_constant)
    canonicalize(v)  # the integer range and the rest
    return v
