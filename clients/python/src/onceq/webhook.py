# SPDX-License-Identifier: Apache-2.0
"""Webhook signature verification (HMAC-SHA256, Stripe-style header).

Header: `Onceq-Signature: t=TIMESTAMP,v1=HEX[,v1=HEX...]` where TIMESTAMP is Unix seconds and
HEX = lowercase hex HMAC-SHA256(secret, f"{TIMESTAMP}.".encode() + body). More than one v1 is
allowed (secret rotation): one match is enough. A timestamp further than tolerance_s from now
is refused (replays of an old delivery)."""
import hashlib
import hmac
import time
from typing import List, Optional, Union

from .errors import OnceqError

SIGNATURE_HEADER = "Onceq-Signature"


class WebhookSignatureError(OnceqError):
    """The signature header is missing, malformed, too old, or matches no v1 signature."""


def _key(secret: Union[str, bytes]) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)


def sign_webhook(secret: Union[str, bytes], body: bytes, timestamp: Optional[int] = None) -> str:
    """The header value a sender puts on `body` (for tests and for receivers' own fixtures)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    mac = hmac.new(_key(secret), str(t).encode("ascii") + b"." + body, hashlib.sha256)
    return "t=%d,v1=%s" % (t, mac.hexdigest())


def verify_webhook(secret: Union[str, bytes], body_bytes: bytes, header_value: Optional[str],
                   tolerance_s: float = 300, now: Optional[float] = None) -> int:
    """Check a delivery: returns its timestamp, or raises WebhookSignatureError.

    body_bytes must be the raw request body, exactly as received (not re-serialized JSON).
    tolerance_s <= 0 turns the age check off."""
    if not isinstance(body_bytes, (bytes, bytearray, memoryview)):
        raise TypeError("body_bytes must be the raw body as bytes")
    if not header_value:
        raise WebhookSignatureError("no signature header")
    t: Optional[int] = None
    sigs: List[str] = []
    for part in header_value.split(","):
        k, sep, v = part.strip().partition("=")
        if not sep:
            continue
        if k == "t" and v.isdigit():
            t = int(v)
        elif k == "v1":
            sigs.append(v.strip().lower())
    if t is None:
        raise WebhookSignatureError("no timestamp (t=) in the signature header")
    if not sigs:
        raise WebhookSignatureError("no v1 signature in the signature header")
    if tolerance_s > 0:
        age = (time.time() if now is None else now) - t
        if abs(age) > tolerance_s:
            raise WebhookSignatureError("timestamp %d is outside the tolerance (%g s)"
                                        % (t, tolerance_s))
    want = hmac.new(_key(secret), str(t).encode("ascii") + b"." + bytes(body_bytes),
                    hashlib.sha256).hexdigest()
    ok = False
    for s in sigs:  # compare every one, in constant time
        ok = hmac.compare_digest(want.encode("ascii"), s.encode("utf-8", "replace")) or ok
    if not ok:
        raise WebhookSignatureError("no v1 signature matches the body")
    return t
