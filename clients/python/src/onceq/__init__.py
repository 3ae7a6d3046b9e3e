# SPDX-License-Identifier: Apache-2.0
"""onceq: a client for onceq's HTTP API (Python 3.8+, standard library only)."""
from ._jcs import canonicalize, fingerprint, parse_strict
from .client import TERMINAL, AsyncClient, Call, Client, retry_after_seconds
from .errors import (ApiError, BadRequest, Forbidden, IdempotencyConflict, MethodNotAllowed,
                     NotFound, OnceqError, PayloadTooLarge, RateLimited, TenantMismatch,
                     TransportError, Unauthorized, Unavailable, WaitTimeout)
from .webhook import SIGNATURE_HEADER, WebhookSignatureError, sign_webhook, verify_webhook

__version__ = "0.1.0"
__all__ = [
    "AsyncClient", "Call", "Client", "TERMINAL", "canonicalize", "fingerprint", "parse_strict",
    "retry_after_seconds", "ApiError", "BadRequest", "Forbidden", "IdempotencyConflict",
    "MethodNotAllowed", "NotFound", "OnceqError", "PayloadTooLarge", "RateLimited",
    "TenantMismatch", "TransportError", "Unauthorized", "Unavailable", "WaitTimeout",
    "SIGNATURE_HEADER", "WebhookSignatureError", "sign_webhook", "verify_webhook",
]
