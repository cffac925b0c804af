"""FastAPI integration over an ``AsyncIdempotency``: a route class and two markers.

    idem = FastAPIIdempotency(AsyncIdempotency(pool))
    router = APIRouter(route_class=idem.route_class)

    @router.post("/orders", status_code=201)
    @idem.transactional(required=True)
    async def create_order(order: Order, conn: AsyncConnection = Depends(idem.connection)):
        ...                                 # the transaction's connection

    @router.post("/payments")
    @idem.leased(lease=timedelta(seconds=30))
    async def pay(lease: Optional[Lease] = Depends(idem.lease)):
        ...                                 # no transaction open

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
from .lease import Lease
from .results import Executed, Reply

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
RouteHandler = Callable[[Request], Coroutine[Any, Any, Response]]
_OPTIONS = "__idempotency__"
_CONNECTION = "idempotency_connection"
_LEASE = "idempotency_lease"


class FastAPIIdempotency(http.RouteDecorators[Endpoint]):
    """Idempotency-Key support for FastAPI routes.

    ``tenant``: called with the request, returns the tenant that prefixes the scope (or None).
    """

    def __init__(self, idempotency: AsyncIdempotency, *,
                 tenant: Optional[Callable[[Request], Union[Optional[str],
                                                            Awaitable[Optional[str]]]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
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
    def lease(request: Request) -> Optional[Lease]:
        """Dependency: the lease of a leased route (None when the optional key was absent)."""
        held: Optional[Lease] = getattr(request.state, _LEASE, None)
        return held

    async def _handle(self, request: Request, path: str, options: http.RouteOptions,
                      original: RouteHandler) -> Response:
        tenant = None
        if self.tenant is not None:
            found = self.tenant(request)
            tenant = await found if inspect.isawaitable(found) else found
        prepared = http.prepare(self.settings, options, method=request.method, route=path,
                                path=request.url.path,
                                headers=request.headers, body=await request.body(),
                                content_type=request.headers.get("content-type"),
                                tenant=tenant)
        if isinstance(prepared, http.HttpResponse):
            return _to_response(prepared)
        idem = self.idempotency
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                return await original(request)
            async with idem.pool.connection() as conn, conn.transaction():
                setattr(request.state, _CONNECTION, conn)
                return await _buffered(await original(request))

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

        async def in_transaction(conn: psycopg.AsyncConnection[Any]) -> Reply:
            setattr(request.state, _CONNECTION, conn)
            return await capture()

        async def with_lease(held: Lease) -> Reply:
            setattr(request.state, _LEASE, held)
            return await capture()

        try:
            if options.mode == "transaction":
                result = await idem.run_in_transaction(
                    prepared.key, in_transaction, request=prepared.request,
                    fingerprint=prepared.fingerprint, scope=prepared.scope, ttl=options.ttl,
                    wait=options.wait, read_row=False)
            else:
                result = await idem.run_with_lease(
                    prepared.key, with_lease, request=prepared.request,
                    fingerprint=prepared.fingerprint, scope=prepared.scope, ttl=options.ttl,
                    lease=options.lease, wait=options.wait, heartbeat=options.heartbeat,
                    read_row=False)
        except errors.IdempotencyError as exc:
            answer = http.for_error(exc)
            if answer is None:
                raise
            return _to_response(answer)
        if isinstance(result, Executed):
            return produced[0]
        return _to_response(http.for_result(result))


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
    out.raw_headers.append((b"content-length", str(len(response.body)).encode()))
    return out


__all__ = ["FastAPIIdempotency"]
