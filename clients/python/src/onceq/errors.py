# SPDX-License-Identifier: Apache-2.0
"""Typed exceptions: one class per stable error code of onceq's HTTP API."""
from typing import Any, Dict, Optional, Type


class OnceqError(Exception):
    """Base of every error this package raises."""


class ApiError(OnceqError):
    """The producer answered with an error body {"error":{"code","message"}}.

    status: the HTTP status; code: the stable error code (e.g. "idempotency_conflict");
    retry_after: seconds from Retry-After, or None."""

    def __init__(self, status: int, code: str, message: str,
                 retry_after: Optional[float] = None, body: bytes = b"") -> None:
        super().__init__("HTTP %d %s: %s" % (status, code, message))
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.body = body


class BadRequest(ApiError):
    """400: bad_request, missing_idempotency_key, invalid_idempotency_key."""


class Unauthorized(ApiError):
    """401 unauthorized: no valid bearer token."""


class Forbidden(ApiError):
    """403: tenant_mismatch, forbidden."""


class TenantMismatch(Forbidden):
    """403 tenant_mismatch: the tenant is not the bearer token's."""


class NotFound(ApiError):
    """404 not_found: no such call or key (or another tenant's)."""


class MethodNotAllowed(ApiError):
    """405 method_not_allowed."""


class PayloadTooLarge(ApiError):
    """413 payload_too_large."""


class ReviewConflict(ApiError):
    """409 from resolve_task: not_awaiting_approval, not_in_review, not_retryable (the task is
    not in the status the decision needs) or review_moved (the fence moved): nothing changed."""


class IdempotencyConflict(ApiError):
    """422 idempotency_conflict: the key was used with a different request."""


class RateLimited(ApiError):
    """429: too many requests (retried until the deadline, then raised)."""


class Unavailable(ApiError):
    """503 unavailable, or another 5xx (retried until the deadline, then raised)."""


class TransportError(OnceqError):
    """No HTTP answer: connection refused or lost, timeout (retried until the deadline)."""


class WaitTimeout(OnceqError):
    """The call was not terminal before the deadline; .call is the last state seen."""

    def __init__(self, message: str, call: Any = None) -> None:
        super().__init__(message)
        self.call = call


_BY_CODE: Dict[str, Type[ApiError]] = {
    "bad_request": BadRequest,
    "missing_idempotency_key": BadRequest,
    "invalid_idempotency_key": BadRequest,
    "unauthorized": Unauthorized,
    "tenant_mismatch": TenantMismatch,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "payload_too_large": PayloadTooLarge,
    "idempotency_conflict": IdempotencyConflict,
    "bad_task": BadRequest,
    "bad_reference": BadRequest,
    "review_moved": ReviewConflict,
    "unavailable": Unavailable,
}
_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    409: ReviewConflict, 413: PayloadTooLarge, 422: IdempotencyConflict, 429: RateLimited,
}


def error_for(status: int, code: str, message: str, retry_after: Optional[float] = None,
              body: bytes = b"") -> ApiError:
    """The exception for an error answer: by its code, else by its status."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (
        Unavailable if status >= 500 else ApiError)
    return cls(status, code, message, retry_after, body)
