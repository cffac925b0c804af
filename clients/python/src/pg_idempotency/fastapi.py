"""FastAPI integration over an ``AsyncIdempotency``: a route class and two markers.

    idem = FastAPIIdempotency(AsyncIdempotency(pool), caller=user_id)  # the authenticated user
    router = APIRouter(route_class=idem.route_class)

    @router.post("/orders", status_code=201)
    @idem.transactional(required=True)
    async def create_order(order: Order, conn: AsyncConnection = Depends(idem.connection)):
        ...                                 # the transaction's connection

    @router.post("/payments")
    @idem.leased(lease=timedelta(seconds=30))
    async def pay(lease: Optional[Lease] = Depends(idem.lease)):
        ...                                 # no transaction open

``Depends(idem.context)`` gives the key, scope and attempt. Hooks: ``validate(request)`` runs
before the key is claimed (a Response it returns is the answer, nothing is stored);
``on_committed(context, response)`` runs after the result is stored (a success or a final
failure), before the answer is sent; either may be a coroutine function.

The route class wraps the marked endpoints only: it needs the route template (the scope) and
the finished response (to store it), which a dependency or a middleware does not see.
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Coroutine, Optional, TypeVar, Union

import psycopg
from fastapi import Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from . import errors
from . import http
from .aio import AsyncIdempotency
from .lease import KeyContext, Lease
from .results import ClaimResult, Executed, Reply

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
RouteHandler = Callable[[Request], Coroutine[Any, Any, Response]]
_OPTIONS = "__idempotency__"
_CONNECTION = "idempotency_connection"
_LEASE = "idempotency_lease"
_CONTEXT = "idempotency"


class FastAPIIdempotency(http.RouteDecorators[Endpoint]):
    """Idempotency-Key support for FastAPI routes.

    ``caller``: called with the request (may be a coroutine function), returns who sends it
    (the authenticated principal's id; None or "" when nobody is authenticated: a keyed
    request is then 401); every key is scoped by it. ``public=True`` instead: the routes have
    no callers (a route may also give its own ``caller`` or ``public``; a route without
    either is a TypeError when it is marked).
    ``tenant``: called with the request, returns the tenant that prefixes the scope (or None);
    take it from the authenticated principal, never from a header the client chooses.
    """

    def __init__(self, idempotency: AsyncIdempotency, *,
                 caller: Optional[Callable[[Request], Union[http.CallerId,
                                                            Awaitable[http.CallerId]]]] = None,
                 public: bool = False,
                 tenant: Optional[Callable[[Request], Union[Optional[str],
                                                            Awaitable[Optional[str]]]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
        http.check_caller(caller, public)
        self.caller = caller
        self.public = public
        self.idempotency = idempotency
        self.tenant = tenant
        self.settings = settings
        integration = self

        class IdempotentRoute(APIRoute):
            def get_route_handler(self) -> RouteHandler:
                original = super().get_route_handler()
                options: Optional[http.RouteOptions] = getattr(self.endpoint, _OPTIONS, None)
                if options is None:
                    return original
                path = self.path

                async def handler(request: Request) -> Response:
                    return await integration._handle(request, path, options, original)
                return handler

        #: pass to APIRouter(route_class=...) or set as app.router.route_class
        self.route_class: type[APIRoute] = IdempotentRoute

    def _decorator(self, options: http.RouteOptions) -> Callable[[Endpoint], Endpoint]:
        return _mark(options)

    @staticmethod
    def connection(request: Request) -> psycopg.AsyncConnection[Any]:
        """Dependency: the connection of a transactional route's transaction."""
        conn: Optional[psycopg.AsyncConnection[Any]] = getattr(request.state, _CONNECTION,
                                                                None)
        if conn is None:
            raise errors.UsageError("idem.connection is only available in a route marked "
                                    "@idem.transactional() whose router uses idem.route_class")
        return conn

    @staticmethod
    def context(request: Request) -> Optional[KeyContext]:
        """Dependency: the key, scope and attempt of this request (a ``Lease`` in lease mode;
        None when the optional key was absent)."""
        held: Optional[KeyContext] = getattr(request.state, _CONTEXT, None)
        return held

    @staticmethod
    def lease(request: Request) -> Optional[Lease]:
        """Dependency: the lease of a leased route (None when the optional key was absent)."""
        held: Optional[Lease] = getattr(request.state, _LEASE, None)
        return held

    async def _handle(self, request: Request, path: str, options: http.RouteOptions,
                      original: RouteHandler) -> Response:
        prepared = await self._prepare(request, path, options)
        if isinstance(prepared, http.HttpResponse):
            return _to_response(prepared)
        if options.validate is not None:
            refused = await _maybe_await(options.validate(request))
            if refused is not None:
                return refused
        idem = self.idempotency
        setattr(request.state, _CONTEXT, None)
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                response = await original(request)
            else:
                async with idem.pool.connection() as conn, conn.transaction():
                    setattr(request.state, _CONNECTION, conn)
                    response = await _buffered(await original(request))
            return response

        produced: list[Response] = []

        async def capture() -> Reply:
            try:
                response = await _buffered(await original(request))
            except HTTPException as exc:  # raise HTTPException(404) is an answer, stored too
                handler = request.app.exception_handlers.get(HTTPException,
                                                             http_exception_handler)
                response = await _buffered(await handler(request, exc))
            produced[:] = [response]
            captured = http.HttpResponse(response.status_code, list(response.headers.items()),
                                         bytes(response.body))
            return http.reply_for(self.settings, await idem.extension(), captured)

        def claimed(claim: ClaimResult) -> None:
            assert claim.attempt is not None
            setattr(request.state, _CONTEXT, KeyContext(prepared.key, prepared.scope,
                                                        claim.attempt, claim.inserted))

        async def in_transaction(conn: psycopg.AsyncConnection[Any]) -> Reply:
            setattr(request.state, _CONNECTION, conn)
            return await capture()

        async def with_lease(held: Lease) -> Reply:
            setattr(request.state, _LEASE, held)
            setattr(request.state, _CONTEXT, held)
            return await capture()

        try:
            if options.mode == "transaction":
                result = await idem.run_in_transaction(
                    prepared.key, in_transaction, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, wait=options.wait,
                    keep_writes_on_error=options.keep_writes_on_error, on_claim=claimed,
                    read_row=False)
            else:
                result = await idem.run_with_lease(
                    prepared.key, with_lease, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, lease=options.lease,
                    wait=options.wait, heartbeat=options.heartbeat, read_row=False)
        except (errors.IdempotencyError, *http.UNAVAILABLE) as exc:
            answer = http.for_error(exc)
            if answer is None:
                raise
            return _to_response(answer)
        if isinstance(result, Executed):
            if http.stored(result.reply):
                await self._committed(options, getattr(request.state, _CONTEXT), produced[0])
            return produced[0]
        return _to_response(http.for_result(result))

    async def _prepare(self, request: Request, path: str, options: http.RouteOptions
                       ) -> Union[http.KeyedRequest, http.UnkeyedRequest, http.HttpResponse]:
        """The key, the caller and the body, checked in that order before the database; the
        body is read only for a keyed request, up to the limit."""
        if not http.claims(options, request.method):
            return http.UnkeyedRequest()
        scope = request.scope
        key = http.read_key(self.settings, options,
                            http.asgi_header_lines(scope, self.settings.header))
        if not isinstance(key, str):
            return key
        caller = None
        if options.caller is not None:
            caller = http.caller_id(await _maybe_await(options.caller(request)))
            if isinstance(caller, http.HttpResponse):
                return caller
        limit = options.max_body_bytes
        assert limit is not None
        declared = http.asgi_header(scope, "content-length")
        if http.declared_too_large(declared, limit):
            return http.too_large(limit)
        body = await _read_body(request, limit)
        if isinstance(body, http.HttpResponse):
            return body
        if declared is not None and declared.isdigit() and int(declared) != len(body):
            return http.body_unavailable()  # a middleware read it first
        tenant = None
        if self.tenant is not None:
            tenant = await _maybe_await(self.tenant(request))
        return http.keyed(
            self.settings, key, method=request.method, route=path, tenant=tenant,
            caller=caller, target=http.asgi_target(scope),
            content_type=http.asgi_header(scope, "content-type"),
            header=lambda name: http.asgi_header(scope, name), body=body)

    @staticmethod
    async def _committed(options: http.RouteOptions, context: KeyContext,
                         response: Response) -> None:
        hook = options.on_committed
        if hook is None:
            return
        try:
            await _maybe_await(hook(context, response))
        except Exception:
            http.logger.exception("the on_committed hook failed (the result is stored)")


async def _read_body(request: Request, limit: int) -> Union[bytes, http.HttpResponse]:
    """The body, received in chunks (413 past ``limit``: receiving stops), and kept where
    ``request.body()``, ``request.json()`` and FastAPI's body parameters find it."""
    cached: Optional[bytes] = getattr(request, "_body", None)
    if cached is not None:  # something read it with request.body() already
        return cached if len(cached) <= limit else http.too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return http.too_large(limit)
            chunks.append(chunk)
    except RuntimeError:  # "Stream consumed": something read it without keeping it
        return http.body_unavailable()
    body = b"".join(chunks)
    request._body = body  # Starlette's own cache of request.body()
    return body


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _mark(options: http.RouteOptions) -> Callable[[Endpoint], Endpoint]:
    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, _OPTIONS, options)
        return endpoint
    return mark


async def _buffered(response: Response) -> Response:
    """The response with its whole body in memory (a streamed one is read out), to store it."""
    if hasattr(response, "body"):
        return response
    chunks = [chunk if isinstance(chunk, bytes) else chunk.encode(response.charset)
              async for chunk in response.body_iterator]  # type: ignore[attr-defined]
    body = b"".join(chunks)
    buffered = Response(body, status_code=response.status_code)
    buffered.raw_headers = [(k, v) for k, v in response.raw_headers if k != b"content-length"]
    buffered.raw_headers.append((b"content-length", str(len(body)).encode()))
    return buffered


def _to_response(response: http.HttpResponse) -> Response:
    out = Response(response.body, status_code=response.status)
    out.raw_headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                       for name, value in response.headers]
    if http.has_body(response.status):
        out.raw_headers.append((b"content-length", str(len(response.body)).encode()))
    return out


__all__ = ["FastAPIIdempotency"]
