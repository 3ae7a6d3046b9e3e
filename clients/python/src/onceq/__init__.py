# SPDX-License-Identifier: Apache-2.0
"""onceq: a client for onceq's HTTP API (Python 3.8+, standard library only)."""
from ._jcs import canonicalize, fingerprint, parse_strict
from .client import (TASK_TERMINAL, TERMINAL, AsyncClient, Call, Client, Task, TaskStep,
                     retry_after_seconds)
from .errors import (ApiError, BadRequest, Forbidden, IdempotencyConflict, MethodNotAllowed,
                     NotFound, OnceqError, PayloadTooLarge, RateLimited, ReviewConflict,
                     TenantMismatch, TransportError, Unauthorized, Unavailable, WaitTimeout)
from .webhook import SIGNATURE_HEADER, WebhookSignatureError, sign_webhook, verify_webhook

__version__ = "0.1.0"
__all__ = [
    "AsyncClient", "Call", "Client", "TERMINAL", "TASK_TERMINAL", "Task", "TaskStep",
    "canonicalize", "fingerprint", "parse_strict",
    "retry_after_seconds", "ApiError", "BadRequest", "Forbidden", "IdempotencyConflict",
    "MethodNotAllowed", "NotFound", "OnceqError", "PayloadTooLarge", "RateLimited",
    "ReviewConflict", "TenantMismatch", "TransportError", "Unauthorized", "Unavailable",
    "WaitTimeout",
    "SIGNATURE_HEADER", "WebhookSignatureError", "sign_webhook", "verify_webhook",
]
