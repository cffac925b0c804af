"""HTTP Idempotency-Key handling shared by the framework integrations (no framework here),
as docs/http.md defines it.

A request is checked before the database (the key header's syntax, who the caller is, the body's
size), its scope is the method, the route template and the caller (with an optional tenant in
front: ``http_scope``), and its fingerprint is a SHA-256 of the method, the raw request target,
the Content-Type, chosen headers and the exact body bytes (``fingerprint``). A response is captured as status, chosen headers and body bytes and replayed
byte for byte with ``Idempotent-Replayed: true``. Errors are RFC 9457 problem details.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, replace
from datetime import timedelta
from http import HTTPStatus
from typing import (Any, Callable, Generic, Iterable, Literal, Mapping, Optional, Sequence,
                    TypeVar, Union)
from urllib.parse import quote

import psycopg
from psycopg_pool import PoolTimeout

from . import _protocol as proto
from . import errors
from .results import ClaimResult, InProgress, Replayed, Reply

Disposition = Literal["complete", "terminal", "retryable"]
#: what a caller hook returns: the principal's id (None or "": nobody authenticated)
CallerId = Union[str, int, None]
REPLAYED_HEADER = "Idempotent-Replayed"
PROBLEM_JSON = "application/problem+json"
#: methods that read: passed through without a claim unless a route sets claim_safe_methods
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
DEFAULT_MAX_BODY_BYTES = 100 * 1024
#: the size of one read of a request body (the body is read up to the limit and one byte more)
READ_CHUNK = 64 * 1024
CALLER_REQUIRED = (
    "pg_idempotency: say who the caller is: caller=lambda request: request.user.id (the"
    " authenticated principal), or public=True for a route without callers (e.g. a webhook keyed"
    " by the sender's own event id); see docs/http.md \"Keys belong to a caller\"")
_FINGERPRINT_PREFIX = b"idempotency-http/1\n"
logger = logging.getLogger(__name__)


def default_disposition(status: int) -> Disposition:
    """2xx/3xx are stored as successes; 4xx as final failures (replayed to every retry) except
    408, 425 and 429, which with 5xx are retryable failures (lease mode stores them for a
    takeover, same-transaction mode rolls back and stores nothing)."""
    if status >= 500 or status in (408, 425, 429):
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
    #: lease mode: extend the lease every third of it while the handler runs; None: whenever
    #: the extension can (1.2 and later), True: require it, False: never
    heartbeat: Optional[bool] = None
    #: same-transaction mode: keep the handler's writes when its answer is a stored 4xx
    keep_writes_on_error: bool = False
    #: who sends the request (the integration's ``caller`` unless the route gives its own);
    #: None with ``public``
    caller: Optional[Callable[..., Any]] = None
    #: the route has no callers: keys are shared by everyone who sends one (a webhook)
    public: bool = False
    #: GET, HEAD, OPTIONS and TRACE are claimed too (by default they pass through)
    claim_safe_methods: bool = False
    #: a keyed request's body limit in bytes (None: the integration's ``max_body_bytes``)
    max_body_bytes: Optional[int] = None
    #: runs before the key is claimed; an answer it gives is sent and nothing is stored
    validate: Optional[Callable[..., Any]] = None
    #: runs after the result is stored (a success or a final failure), before the answer is
    #: sent; its failure is logged
    on_committed: Optional[Callable[..., Any]] = None


Handler = TypeVar("Handler", bound=Callable[..., Any])


class RouteDecorators(Generic[Handler]):
    """``transactional()`` and ``leased()`` of every framework integration: each builds the
    route's options and hands them to the integration's ``_decorator``. The hooks' arguments
    are the integration's (see its doc)."""

    #: set by the integration's constructor (``check_caller``)
    caller: Optional[Callable[..., Any]] = None
    public: bool = False
    settings: HttpSettings

    def _decorator(self, options: RouteOptions) -> Callable[[Handler], Handler]:
        raise NotImplementedError

    def _route_options(self, options: RouteOptions) -> RouteOptions:
        """The route's options with its caller settled: the route's own ``caller`` or
        ``public``, else the integration's; neither is a TypeError now, at decoration."""
        check_caller(options.caller, options.public)
        if options.public or options.caller is not None:
            caller, public = options.caller, options.public
        elif self.public or self.caller is not None:
            caller, public = self.caller, self.public
        else:
            raise TypeError(CALLER_REQUIRED)
        limit = (options.max_body_bytes if options.max_body_bytes is not None
                 else self.settings.max_body_bytes)
        if limit < 0:
            raise ValueError("max_body_bytes must be 0 or more")
        return replace(options, caller=caller, public=public, max_body_bytes=limit)

    def transactional(self, *, required: bool = False, ttl: Optional[timedelta] = None,
                      wait: Optional[timedelta] = None, keep_writes_on_error: bool = False,
                      validate: Optional[Callable[..., Any]] = None,
                      on_committed: Optional[Callable[..., Any]] = None,
                      caller: Optional[Callable[..., Any]] = None, public: bool = False,
                      claim_safe_methods: bool = False, max_body_bytes: Optional[int] = None
                      ) -> Callable[[Handler], Handler]:
        """Same-transaction mode: the handler's writes, the key and the stored response commit
        together (how the handler gets the transaction's connection: the integration's doc).
        An answer stored as a final failure (4xx) rolls the handler's writes back first, unless
        ``keep_writes_on_error``."""
        return self._decorator(self._route_options(RouteOptions(
            "transaction", required, ttl=ttl, wait=wait,
            keep_writes_on_error=keep_writes_on_error, validate=validate,
            on_committed=on_committed, caller=caller, public=public,
            claim_safe_methods=claim_safe_methods, max_body_bytes=max_body_bytes)))

    def leased(self, *, required: bool = False, lease: Optional[timedelta] = None,
               ttl: Optional[timedelta] = None, wait: Optional[timedelta] = None,
               heartbeat: Optional[bool] = None, validate: Optional[Callable[..., Any]] = None,
               on_committed: Optional[Callable[..., Any]] = None,
               caller: Optional[Callable[..., Any]] = None, public: bool = False,
               claim_safe_methods: bool = False, max_body_bytes: Optional[int] = None
               ) -> Callable[[Handler], Handler]:
        """Lease mode: the handler runs with no transaction open and its response is stored
        fenced by the attempt (how it gets the lease: the integration's doc). Heartbeats keep
        the lease alive by default (``heartbeat=False``: none)."""
        return self._decorator(self._route_options(RouteOptions(
            "lease", required, lease=lease, ttl=ttl, wait=wait, heartbeat=heartbeat,
            validate=validate, on_committed=on_committed, caller=caller, public=public,
            claim_safe_methods=claim_safe_methods, max_body_bytes=max_body_bytes)))


def check_caller(caller: Optional[Callable[..., Any]], public: bool) -> None:
    """``caller`` and ``public`` exclude each other."""
    if caller is not None and public:
        raise TypeError("pg_idempotency: give caller= or public=True, not both: a public route"
                        " shares its keys between every sender")


@dataclass(frozen=True)
class HttpSettings:
    """What every route of one integration shares."""

    header: str = "Idempotency-Key"
    #: as the extension's idempotency.max_key_length: bytes after unescaping
    max_key_length: int = 255
    #: request headers that are part of the fingerprint (e.g. an account header)
    fingerprint_headers: Sequence[str] = ()
    #: response headers that are stored and replayed (the body and status always are)
    replay_headers: Sequence[str] = ("Content-Type", "Location", "Cache-Control")
    disposition: Callable[[int], Disposition] = default_disposition
    #: a keyed request's body limit in bytes (a route may set its own): 413 past it
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


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
    fingerprint: bytes


@dataclass(frozen=True)
class UnkeyedRequest:
    """An optional key was not given: run the handler without idempotency."""


# The titles of the statuses this module answers with, fixed here: Python 3.13's HTTPStatus
# renamed 422 ("Unprocessable Content"), and the answer must not change with the interpreter.
TITLES = {400: "Bad Request", 401: "Unauthorized", 409: "Conflict", 413: "Content Too Large",
          422: "Unprocessable Entity", 500: "Internal Server Error", 503: "Service Unavailable"}


def problem(status: int, code: str, detail: str,
            headers: Sequence[tuple[str, str]] = ()) -> HttpResponse:
    """An RFC 9457 problem details answer; ``detail`` never quotes the request."""
    title = TITLES.get(status) or HTTPStatus(status).phrase
    body = json.dumps({"type": "about:blank", "title": title, "status": status,
                       "detail": detail, "code": code}).encode()
    return HttpResponse(status, [("Content-Type", PROBLEM_JSON), *headers], body)


def parse_key(lines: Sequence[str], max_length: int = 255) -> Optional[str]:
    """The key of the header's field lines (docs/http.md): one line holding an sf-string
    (``"..."``, escapes ``\\"`` and ``\\\\`` only, characters 0x20-0x7E) or a bare value of
    visible ASCII without ``"`` or ``,``, surrounding spaces and tabs trimmed; 1 to
    ``max_length`` bytes after unescaping. None when it breaks a rule (a repeated header,
    as two lines or one comma-joined list, included)."""
    if len(lines) != 1:
        return None
    value = lines[0].strip(" \t")
    if value.startswith('"'):
        chars: list[str] = []
        i = 1
        while i < len(value):
            c = value[i]
            if c == "\\":
                if i + 1 >= len(value) or value[i + 1] not in '"\\':
                    return None
                chars.append(value[i + 1])
                i += 2
            elif c == '"':
                break
            elif " " <= c <= "~":
                chars.append(c)
                i += 1
            else:
                return None
        if i != len(value) - 1:  # unbalanced, or something after the closing quote
            return None
        key = "".join(chars)
    else:
        if any(not ("!" <= c <= "~") or c in '",' for c in value):
            return None
        key = value
    return key if 1 <= len(key) <= max_length else None


def fingerprint(method: Union[str, bytes], target: Union[str, bytes],
                content_type: Union[str, bytes, None], body: bytes,
                headers: Iterable[tuple[Union[str, bytes], Union[str, bytes, None]]] = ()
                ) -> bytes:
    """The request's fingerprint (docs/http.md): SHA-256 over ``idempotency-http/1\\n`` and,
    for each field, its byte length in decimal, ``:``, its bytes and ``\\n``: the method in
    upper case, the raw target, the Content-Type ("" when absent), each chosen header's
    lower-case name and value sorted by name ("" when absent), and the body bytes. Text is
    taken as ISO-8859-1 (the bytes a server received)."""
    digest = hashlib.sha256(_FINGERPRINT_PREFIX)

    def field(value: Union[str, bytes, None]) -> None:
        data = value.encode("latin-1") if isinstance(value, str) else (value or b"")
        digest.update(b"%d:%s\n" % (len(data), data))

    field(method.upper())
    field(target)
    field(content_type)
    chosen = sorted(((name.lower(), value) for name, value in headers),
                    key=lambda pair: pair[0])
    for name, value in chosen:
        field(name)
        field(value)
    field(body)
    return digest.digest()


def wsgi_target(environ: Mapping[str, Any]) -> bytes:
    """The request target of a WSGI request: RAW_URI or REQUEST_URI when the server sets them
    (werkzeug, gunicorn), else SCRIPT_NAME + PATH_INFO quoted again + QUERY_STRING."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        target = str(raw)
        if not target.startswith("/") and "://" in target:  # absolute form: keep the path on
            rest = target.split("://", 1)[1]
            target = rest[rest.index("/"):] if "/" in rest else "/"
        return target.encode("latin-1")
    path = (str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))
            ).encode("latin-1")
    query = str(environ.get("QUERY_STRING", ""))
    return quote(path, safe="/;=,:@!$&'()*+~").encode("ascii") + (
        b"?" + query.encode("latin-1") if query else b"")


def wsgi_key_lines(environ: Mapping[str, Any], header: str) -> list[str]:
    """The key header as a WSGI server gives it: one value, repeated lines joined with commas
    (which parse_key refuses, as it refuses two lines)."""
    value = environ.get("HTTP_" + header.upper().replace("-", "_"))
    return [] if value is None else [str(value)]


def asgi_target(scope: Mapping[str, Any]) -> bytes:
    """ASGI's raw_path (the path as received) and query_string."""
    path = scope.get("raw_path") or quote(
        (scope.get("root_path", "") + scope["path"]).encode("utf-8"),
        safe="/;=,:@!$&'()*+~").encode("ascii")
    query = scope.get("query_string") or b""
    return bytes(path) + (b"?" + bytes(query) if query else b"")


def asgi_header_lines(scope: Mapping[str, Any], name: str) -> list[str]:
    wanted = name.lower().encode("latin-1")
    return [value.decode("latin-1") for header, value in scope["headers"]
            if header.lower() == wanted]


def asgi_header(scope: Mapping[str, Any], name: str) -> Optional[str]:
    """A request header's field lines joined with ", " in order (docs/http.md), None when
    absent: ASGI keeps every line as received."""
    lines = asgi_header_lines(scope, name)
    return ", ".join(lines) if lines else None


def claims(options: RouteOptions, method: str) -> bool:
    """Whether the route claims a request of this method: GET, HEAD, OPTIONS and TRACE pass
    through (their key header ignored) unless the route sets ``claim_safe_methods``."""
    return options.claim_safe_methods or method.upper() not in SAFE_METHODS


def read_key(settings: HttpSettings, options: RouteOptions,
             key_lines: Sequence[str]) -> Union[str, UnkeyedRequest, HttpResponse]:
    """The key of the request, before the database and before its body is read: the key,
    ``UnkeyedRequest`` (an optional key is absent: nothing is read or claimed), or the 400
    answer."""
    if not key_lines:
        if options.required:
            return problem(400, "idempotency_key_missing",
                           f"this endpoint requires an {settings.header} header")
        return UnkeyedRequest()
    key = parse_key(key_lines, settings.max_key_length)
    if key is None:
        return problem(400, "idempotency_key_invalid",
                       f"the {settings.header} header must be given once, as a string of 1 to"
                       f" {settings.max_key_length} visible ASCII characters (bare, or quoted"
                       " as an sf-string)")
    return key


def caller_id(principal: Any) -> Union[str, HttpResponse]:
    """What the caller hook returned, as the text its scope is made of; no caller (None or
    "") is 401: a key is never claimed for an unknown caller."""
    if principal is None or principal == "":
        return problem(401, "idempotency_caller_unknown",
                       "this endpoint's idempotency keys belong to a caller, and the request"
                       " names none; authenticate")
    if isinstance(principal, bool) or not isinstance(principal, (str, int)):
        raise TypeError("pg_idempotency: the caller hook must return a str (or an int id), or"
                        f" None for no caller; it returned a {type(principal).__name__}")
    return str(principal)


def http_scope(method: str, route: str, tenant: Optional[str] = None,
               caller: Optional[str] = None) -> str:
    """A key's scope (docs/http.md): ``[tenant ":"] METHOD " " route``, and for a route with
    callers `` caller:`` and the lower-case hex SHA-256 of the caller id's UTF-8 bytes (the id
    itself is not stored)."""
    scope = f"{method.upper()} {route}"
    if tenant is not None:
        scope = f"{tenant}:{scope}"
    if caller is not None:
        scope += " caller:" + hashlib.sha256(caller.encode("utf-8")).hexdigest()
    return scope


def too_large(limit: int) -> HttpResponse:
    return problem(413, "idempotency_body_too_large",
                   f"an idempotent request's body may hold at most {limit} bytes")


def declared_too_large(content_length: Optional[str], limit: int) -> bool:
    """Whether a declared Content-Length is past the limit (a malformed one is left to the
    server, which frames the body by it)."""
    return (content_length is not None and content_length.strip().isdigit()
            and int(content_length) > limit)


def read_bounded(read: Callable[[int], bytes], limit: int) -> Optional[bytes]:
    """The body read in chunks through ``read(n)``, or None once it passes ``limit`` bytes:
    reading stops there, holding at most the limit and one chunk."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = read(min(READ_CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def keyed(settings: HttpSettings, key: str, *, method: str, route: str, tenant: Optional[str],
          caller: Optional[str], target: bytes, content_type: Optional[str],
          header: Callable[[str], Optional[str]], body: bytes) -> KeyedRequest:
    """What to claim a keyed request with: its scope (``http_scope``) and its fingerprint
    (``fingerprint``, over ``settings.fingerprint_headers`` read through ``header``)."""
    chosen = [(name, header(name.lower())) for name in settings.fingerprint_headers]
    return KeyedRequest(key, http_scope(method, route, tenant, caller),
                        fingerprint(method, target, content_type, body, chosen))


def has_body(status: int) -> bool:
    """A 1xx, 204 or 304 answer carries neither a body nor Content-Length (RFC 9110)."""
    return status >= 200 and status not in (204, 304)


def body_unavailable() -> HttpResponse:
    """A parser consumed the body before the library could read it: never guess (and say so
    in the log: it is a setup error)."""
    logger.error("the request body was read before the idempotency layer could fingerprint it")
    return problem(500, "idempotency_raw_body_unavailable",
                   "the request body was consumed before the idempotency layer read it; read"
                   " the raw body first (see the integration's documentation)")


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


#: the database cannot be reached: 503 (docs/http.md)
UNAVAILABLE: tuple[type[Exception], ...] = (psycopg.OperationalError, PoolTimeout)


def stored(reply: Reply) -> bool:
    """Whether the handler's reply is the key's answer (a success or a final failure), for
    ``on_committed``: a retryable failure is rolled back (same-transaction mode) or recorded
    only to be taken over (lease mode)."""
    return not (reply.failed and reply.retryable)


def for_error(error: Exception) -> Optional[HttpResponse]:
    """The HTTP answer to an error of this package or of the database connection, or None
    for a bug to let propagate. The detail is fixed text: the server's message may quote the
    key."""
    if isinstance(error, UNAVAILABLE):
        return unavailable("the idempotency store cannot be reached")
    if isinstance(error, errors.KeyMismatchError):
        return problem(422, "idempotency_key_mismatch",
                       "this idempotency key was already used for a different request")
    if isinstance(error, (errors.StaleAttemptError, errors.KeyNotFoundError,
                          errors.KeyNotPendingError)):
        return problem(409, "idempotency_attempt_stale",
                       "the idempotency key was taken over while this request ran; its result"
                       " was not stored", [("Retry-After", "1")])
    if isinstance(error, errors.DatabaseError) and error.http_status == 503:
        return unavailable("the idempotency store is busy", error.retry_after_s)
    if isinstance(error, errors.InvalidArgumentError):
        return problem(400, "idempotency_key_invalid",
                       "the database refused the idempotency key")
    if isinstance(error, errors.DatabaseError):
        logger.error("an idempotency call failed: %s (SQLSTATE %s)", type(error).__name__,
                     error.sqlstate_received)
        return problem(500, "idempotency_internal_error",
                       "the idempotency store failed; retry later")
    return None


def unavailable(detail: str, retry_after_s: int = 1) -> HttpResponse:
    return problem(503, "idempotency_unavailable", detail + "; retry later",
                   [("Retry-After", str(retry_after_s))])


def run_hook(hook: Callable[[], Any], name: str) -> None:
    """``on_committed``: a failure is logged and changes nothing stored or answered."""
    try:
        hook()
    except Exception:
        logger.exception("the %s hook failed (the result is stored)", name)


__all__ = [
    "CALLER_REQUIRED", "CallerId", "DEFAULT_MAX_BODY_BYTES", "Disposition", "HttpResponse", "HttpSettings",
    "KeyedRequest", "RouteOptions", "SAFE_METHODS", "UnkeyedRequest", "default_disposition",
    "fingerprint", "for_error", "for_result", "http_scope", "parse_key", "problem", "replay",
    "reply_for",
]
