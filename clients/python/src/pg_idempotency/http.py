"""HTTP Idempotency-Key handling shared by the framework integrations (no framework here).

A request is checked before the database (key syntax, a JSON body's U+0000), its scope is the
method and the route template (with an optional tenant in front), and its fingerprint covers the
body and chosen request headers. A response is captured as status, chosen headers and body bytes
and replayed byte for byte with ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Generic, Literal, Mapping, Optional, Sequence, TypeVar, Union

from psycopg.types.json import Jsonb

from . import _protocol as proto
from . import errors
from .results import ClaimResult, InProgress, Replayed, Reply

Disposition = Literal["complete", "terminal", "retryable"]
REPLAYED_HEADER = "Idempotent-Replayed"


def default_disposition(status: int) -> Disposition:
    """2xx/3xx are stored as successes, 4xx as final failures (replayed to every retry); 5xx,
    408 and 429 are retryable failures (lease mode stores them for a takeover, same-transaction
    mode rolls back and stores nothing)."""
    if status >= 500 or status in (408, 429):
        return "retryable"
    if status >= 400:
        return "terminal"
    return "complete"


@dataclass(frozen=True)
class RouteOptions:
    """How one route handles the Idempotency-Key header."""

    mode: Literal["transaction", "lease"]
    #: a request without the header gets 400 (otherwise it runs without idempotency)
    required: bool = False
    lease: Optional[timedelta] = None
    ttl: Optional[timedelta] = None
    #: 1.2: wait this long for an in-flight duplicate to finish instead of answering 409 at once
    wait: Optional[timedelta] = None
    #: 1.2: extend the lease while the handler runs (lease mode)
    heartbeat: bool = False


Handler = TypeVar("Handler", bound=Callable[..., Any])


class RouteDecorators(Generic[Handler]):
    """``transactional()`` and ``leased()`` of every framework integration: each builds the
    route's options and hands them to the integration's ``_decorator``."""

    def _decorator(self, options: RouteOptions) -> Callable[[Handler], Handler]:
        raise NotImplementedError

    def transactional(self, *, required: bool = False, ttl: Optional[timedelta] = None,
                      wait: Optional[timedelta] = None) -> Callable[[Handler], Handler]:
        """Same-transaction mode: the handler's writes, the key and the stored response commit
        together (how the handler gets the transaction's connection: the integration's doc)."""
        return self._decorator(RouteOptions("transaction", required, ttl=ttl, wait=wait))

    def leased(self, *, required: bool = False, lease: Optional[timedelta] = None,
               ttl: Optional[timedelta] = None, wait: Optional[timedelta] = None,
               heartbeat: bool = False) -> Callable[[Handler], Handler]:
        """Lease mode: the handler runs with no transaction open and its response is stored
        fenced by the attempt (how it gets the lease: the integration's doc)."""
        return self._decorator(RouteOptions("lease", required, lease=lease, ttl=ttl,
                                            wait=wait, heartbeat=heartbeat))


@dataclass(frozen=True)
class HttpSettings:
    """What every route of one integration shares."""

    header: str = "Idempotency-Key"
    max_key_length: int = 255
    #: request headers that are part of the fingerprint (e.g. an account header)
    fingerprint_headers: Sequence[str] = ()
    #: response headers that are stored and replayed (the body and status always are)
    replay_headers: Sequence[str] = ("Content-Type", "Location")
    disposition: Callable[[int], Disposition] = default_disposition


@dataclass(frozen=True)
class HttpResponse:
    """A response in framework-neutral form."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class KeyedRequest:
    """A request that carries a valid key: what to claim it with."""

    key: str
    scope: str
    request: Optional[Jsonb] = None
    fingerprint: Optional[bytes] = None


@dataclass(frozen=True)
class UnkeyedRequest:
    """An optional key was not given: run the handler without idempotency."""


Prepared = Union[KeyedRequest, UnkeyedRequest, HttpResponse]


def problem(status: int, error: str, detail: str,
            headers: Sequence[tuple[str, str]] = ()) -> HttpResponse:
    body = json.dumps({"error": error, "detail": detail}).encode()
    return HttpResponse(status, [("Content-Type", "application/json"), *headers], body)


def prepare(settings: HttpSettings, options: RouteOptions, *, method: str, route: str,
            path: str, headers: Mapping[str, str], body: bytes, content_type: Optional[str],
            tenant: Optional[str]) -> Prepared:
    """Check the key and the body before the database and say what to claim.

    The scope is the route template; the fingerprint covers the path (so one key sent to
    /orders/1 and then /orders/2 is a mismatch, not a replay of the other order), the body and
    the chosen headers."""
    key = headers.get(settings.header)
    if key is None:
        if options.required:
            return problem(400, "idempotency_key_missing",
                           f"this endpoint requires an {settings.header} header")
        return UnkeyedRequest()
    # printable ASCII: 0x20 to 0x7E (isprintable refuses the ASCII control characters)
    if not (1 <= len(key) <= settings.max_key_length and key.isascii() and key.isprintable()):
        return problem(400, "idempotency_key_invalid",
                       f"the {settings.header} header must be 1 to {settings.max_key_length}"
                       " printable ASCII characters")
    scope = f"{method} {route}" if tenant is None else f"{tenant}:{method} {route}"
    chosen = {name.lower(): headers.get(name) for name in settings.fingerprint_headers}
    text = _json_text(body, content_type)
    if text is not None:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
            text = None  # not JSON after all: the handler answers it; fingerprint the bytes
        else:
            # U+0000 can only be written as the escape \u0000 in valid JSON: without that text,
            # no walk over the parsed value
            if "\\u0000" in text and proto.has_nul(parsed):
                return problem(400, "invalid_json",
                               "JSON strings in the request body must not contain \\u0000")
    if text is not None:
        # the raw text goes to the server, whose jsonb decides equality (key order, numbers)
        raw = ('{"path": ' + json.dumps(path) + ', "headers": ' + json.dumps(chosen)
               + ', "body": ' + text + "}")
        return KeyedRequest(key, scope, request=Jsonb(raw, dumps=_as_is))
    digest = hashlib.sha256()
    digest.update(json.dumps([path, chosen], sort_keys=True).encode())
    digest.update(b"\x00")
    digest.update(body)
    return KeyedRequest(key, scope, fingerprint=digest.digest())


def _as_is(text: Any) -> str:
    return str(text)


def _json_text(body: bytes, content_type: Optional[str]) -> Optional[str]:
    if not body or content_type is None:
        return None
    media = content_type.split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def reply_for(settings: HttpSettings, ext: proto.Extension, response: HttpResponse) -> Reply:
    """The Reply that stores a captured response: 1.2 keeps body and headers in their own
    columns; 1.1 keeps them in the response jsonb (the body as a JSON string, or base64 when it
    is not UTF-8), which jsonb stores exactly."""
    # stored under the configured spelling: frameworks differ in the case they report
    wanted = {name.lower(): name for name in settings.replay_headers}
    kept = {wanted[name.lower()]: value for name, value in response.headers
            if name.lower() in wanted}
    disposition = settings.disposition(response.status)
    failed = disposition != "complete"
    retryable = disposition == "retryable"
    if ext.version_tuple >= proto.V1_2:
        return Reply(None, response.status, body=response.body, headers=kept, failed=failed,
                     retryable=retryable)
    envelope: dict[str, Any] = {"headers": kept}
    try:
        text = response.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        envelope["body"] = text
    else:
        envelope["body_base64"] = base64.b64encode(response.body).decode("ascii")
    return Reply(envelope, response.status, failed=failed, retryable=retryable)


def replay(claim: ClaimResult) -> HttpResponse:
    """The stored response, byte for byte, marked as a replay."""
    headers: Mapping[str, Any]
    if claim.response_body is not None or claim.response_headers is not None:
        headers = claim.response_headers or {}
        body = claim.response_body or b""
    elif isinstance(claim.response, dict) and "headers" in claim.response and (
            "body" in claim.response or "body_base64" in claim.response):
        headers = claim.response["headers"]
        body = (claim.response["body"].encode("utf-8") if "body" in claim.response
                else base64.b64decode(claim.response["body_base64"]))
    else:  # finished by other code through SQL: its JSON response
        headers = {"Content-Type": "application/json"}
        body = json.dumps(claim.response).encode("utf-8")
    return HttpResponse(claim.response_code or 200,
                        [*((str(k), str(v)) for k, v in headers.items()),
                         (REPLAYED_HEADER, "true")], body)


def in_progress(retry_after_s: int) -> HttpResponse:
    return problem(409, "idempotency_key_in_progress",
                   "a request with this idempotency key is being processed; retry later",
                   [("Retry-After", str(retry_after_s))])


def for_result(result: Union[Replayed, InProgress]) -> HttpResponse:
    if isinstance(result, Replayed):
        return replay(result.claim)
    return in_progress(result.retry_after_s)


def for_error(error: errors.IdempotencyError) -> Optional[HttpResponse]:
    """The HTTP answer to an error of this package, or None for a bug to let propagate."""
    if isinstance(error, errors.NulCharacterError):
        return problem(400, "invalid_json", str(error))
    if not isinstance(error, errors.DatabaseError):
        return None
    names = {
        errors.KeyMismatchError: "idempotency_key_mismatch",
        errors.StaleAttemptError: "idempotency_attempt_stale",
        errors.KeyNotFoundError: "idempotency_key_not_found",
        errors.KeyNotPendingError: "idempotency_key_not_pending",
        errors.KeyInProgressError: "idempotency_key_in_progress",
    }
    name = names.get(type(error), "invalid_argument" if error.http_status == 400
                     else "service_unavailable" if error.http_status == 503 else "conflict")
    retry = [("Retry-After", "1")] if error.http_status == 503 else []
    return problem(error.http_status, name, str(error), retry)


__all__ = [
    "Disposition", "HttpResponse", "HttpSettings", "KeyedRequest", "RouteOptions",
    "UnkeyedRequest", "default_disposition", "for_error", "for_result", "prepare", "replay",
    "reply_for",
]
