"""Django integration: view decorators for the two modes over a sync ``Idempotency``.

    idem = DjangoIdempotency(Idempotency(pool), caller=lambda request: request.user.pk)

    @require_POST
    @idem.transactional(required=True)
    def create_order(request, conn):   # the claim's transaction: write through conn
        ...

    @idem.leased(lease=timedelta(seconds=30))
    def pay(request, lease):           # no transaction open; lease.key for the provider
        ...

An ``async def`` view works alike (under ASGI or WSGI): the hooks (``caller``, ``tenant``, a
sync ``validate``, ``on_committed``), the claim, the database calls and the stored response run
in worker threads, the view on the event loop; the ``conn`` or ``lease`` it is given is the sync
one, so it calls the connection through ``sync_to_async`` as Django's ORM is called from async
code.

``request.idempotency`` is the key, scope and attempt (``KeyContext``, a ``Lease`` in lease
mode; None without a key). Hooks: ``validate(request)`` runs before the key is claimed (a
response it returns is the answer, nothing is stored); ``on_committed(context, response)`` runs
after the result is stored (a success or a final failure), before the answer is sent.

The views write through the psycopg 3 connection they are given: the ORM's connection is not
part of the claim's transaction (Django 3.2, Debian's, reaches PostgreSQL only through psycopg2).
"""

from __future__ import annotations

import asyncio
import functools
import io
from typing import Any, Callable, Optional, TypeVar, Union

from asgiref.sync import async_to_sync, sync_to_async

from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from . import errors
from . import http
from .client import Idempotency
from .lease import KeyContext, Lease
from .results import ClaimResult, Executed, Reply

View = TypeVar("View", bound=Callable[..., Any])


class DjangoIdempotency(http.RouteDecorators[View]):
    """Idempotency-Key support for Django function views, sync or ``async def``.

    ``caller``: called with the request, returns who sends it (the authenticated principal:
    ``request.user.pk``, None for an anonymous user, whose keyed request is then 401); every
    key is scoped by it. ``public=True`` instead: the views have no callers (a view may also
    give its own ``caller`` or ``public``; a view without either is a TypeError when it is
    decorated).
    ``tenant``: called with the request, returns the tenant that prefixes the scope (or None);
    take it from the authenticated principal, never from a header the client chooses.
    ``settings``: header name, fingerprinted request headers, replayed response headers, body
    limit, and which statuses are stored as successes, final failures or retryable failures.
    """

    def __init__(self, idempotency: Idempotency, *,
                 caller: Optional[Callable[[HttpRequest], http.CallerId]] = None,
                 public: bool = False,
                 tenant: Optional[Callable[[HttpRequest], Optional[str]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
        http.check_caller(caller, public)
        self.idempotency = idempotency
        self.caller = caller
        self.public = public
        self.tenant = tenant
        self.settings = settings

    def _decorator(self, options: http.RouteOptions) -> Callable[[View], View]:
        def decorate(view: View) -> View:
            if asyncio.iscoroutinefunction(view):
                @functools.wraps(view)
                async def async_wrapper(request: HttpRequest, *args: Any,
                                        **kwargs: Any) -> HttpResponseBase:
                    # off the loop: the caller hook may load request.user (the ORM, which
                    # refuses to run on an event loop), and the body is read from a file
                    prepared = await sync_to_async(self._prepare)(options, request)
                    if isinstance(prepared, http.HttpResponse):
                        return _to_django(prepared)
                    validate = options.validate
                    if validate is not None:
                        refused = (await validate(request) if asyncio.iscoroutinefunction(validate)
                                   else await sync_to_async(validate)(request))
                        if refused is not None:
                            return refused  # type: ignore[no-any-return]

                    def call(**extra: Any) -> HttpResponseBase:
                        # from the worker thread: the coroutine runs on the request's loop
                        response: HttpResponseBase = async_to_sync(view)(
                            request, *args, **extra, **kwargs)
                        return response

                    # not thread_sensitive: Django's one sync thread would serialise every
                    # request behind a handler that waits
                    run = sync_to_async(self._run, thread_sensitive=False)
                    response: HttpResponseBase = await run(options, prepared, request, call)
                    return response
                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(view)
            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
                prepared = self._prepare(options, request)
                if isinstance(prepared, http.HttpResponse):
                    return _to_django(prepared)
                if options.validate is not None:
                    refused = options.validate(request)
                    if refused is not None:
                        return refused  # type: ignore[no-any-return]
                return self._run(options, prepared, request,
                                 lambda **extra: view(request, *args, **extra, **kwargs))
            return wrapper  # type: ignore[return-value]
        return decorate

    def _prepare(self, options: http.RouteOptions, request: HttpRequest
                 ) -> Union[http.KeyedRequest, http.UnkeyedRequest, http.HttpResponse]:
        """The key, the caller and the body, checked in that order before the database; the
        body is read only for a keyed request whose Content-Length is within the limit."""
        if not http.claims(options, request.method or "GET"):
            return http.UnkeyedRequest()
        asgi_scope = getattr(request, "scope", None)  # an ASGIRequest keeps the raw lines
        meta = request.META
        key = http.read_key(self.settings, options,
                            http.asgi_header_lines(asgi_scope, self.settings.header)
                            if asgi_scope is not None
                            else http.wsgi_key_lines(meta, self.settings.header))
        if not isinstance(key, str):
            return key
        caller = None
        if options.caller is not None:
            caller = http.caller_id(options.caller(request))
            if isinstance(caller, http.HttpResponse):
                return caller
        limit = options.max_body_bytes
        assert limit is not None
        if http.declared_too_large(meta.get("CONTENT_LENGTH") or None, limit):
            return http.too_large(limit)
        body = _read_body(request, limit)
        if isinstance(body, http.HttpResponse):
            return body
        match = request.resolver_match
        route = "/" + match.route if match is not None and match.route else request.path
        if asgi_scope is not None:
            target = http.asgi_target(asgi_scope)
            content_type = http.asgi_header(asgi_scope, "content-type")

            def header(name: str) -> Optional[str]:
                return http.asgi_header(asgi_scope, name)
        else:
            target = http.wsgi_target(meta)
            content_type = meta.get("CONTENT_TYPE")
            header = request.headers.get
        return http.keyed(
            self.settings, key, method=request.method or "GET", route=route,
            tenant=self.tenant(request) if self.tenant is not None else None, caller=caller,
            target=target, content_type=content_type, header=header, body=body)

    def _run(self, options: http.RouteOptions,
             prepared: Union[http.KeyedRequest, http.UnkeyedRequest], request: HttpRequest,
             view: Callable[..., HttpResponseBase]) -> HttpResponseBase:
        """Claim, run ``view(conn=...)`` or ``view(lease=...)``, store and answer (sync: in a
        worker thread for an async view)."""
        idem = self.idempotency
        setattr(request, "idempotency", None)
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                return view(lease=None)
            with idem.pool.connection() as conn, conn.transaction():
                return view(conn=conn)

        produced: list[HttpResponseBase] = []

        def capture(view_call: Callable[[], HttpResponseBase]) -> Reply:
            try:
                response = view_call()
            except (Http404, PermissionDenied, SuspiciousOperation) as exc:
                # Django's own answers to these (404, 403, 400) are stored like any other
                response = response_for_exception(request, exc)
            if response.streaming:
                raise errors.UsageError("an idempotent view must not return a streaming "
                                        "response: its body is stored to be replayed")
            produced[:] = [response]
            captured = http.HttpResponse(response.status_code, list(response.items()),
                                         response.content)  # type: ignore[attr-defined]
            return http.reply_for(self.settings, idem.extension(), captured)

        def claimed(claim: ClaimResult) -> None:
            assert claim.attempt is not None
            setattr(request, "idempotency", KeyContext(prepared.key, prepared.scope,
                                                       claim.attempt, claim.inserted))

        def leased(lease: Lease) -> Reply:
            setattr(request, "idempotency", lease)
            return capture(lambda: view(lease=lease))

        try:
            if options.mode == "transaction":
                result = idem.run_in_transaction(
                    prepared.key, lambda conn: capture(lambda: view(conn=conn)),
                    fingerprint=prepared.fingerprint, scope=prepared.scope, ttl=options.ttl,
                    wait=options.wait, keep_writes_on_error=options.keep_writes_on_error,
                    on_claim=claimed, read_row=False)
            else:
                result = idem.run_with_lease(
                    prepared.key, leased, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, lease=options.lease,
                    wait=options.wait, heartbeat=options.heartbeat, read_row=False)
        except (errors.IdempotencyError, *http.UNAVAILABLE) as exc:
            answer = http.for_error(exc)
            if answer is None:
                raise
            return _to_django(answer)
        if isinstance(result, Executed):
            if http.stored(result.reply):
                self._committed(options, getattr(request, "idempotency"), produced[0])
            return produced[0]
        return _to_django(http.for_result(result))

    @staticmethod
    def _committed(options: http.RouteOptions, context: KeyContext,
                   response: HttpResponseBase) -> None:
        hook = options.on_committed
        if hook is None:
            return
        if asyncio.iscoroutinefunction(hook):  # from an async view's worker thread
            call = async_to_sync(hook)
            http.run_hook(lambda: call(context, response), "on_committed")
        else:
            http.run_hook(lambda: hook(context, response), "on_committed")


def _read_body(request: HttpRequest, limit: int) -> Union[bytes, http.HttpResponse]:
    """The body, read in chunks (413 past ``limit``: reading stops), and kept where
    ``request.body`` and ``request.POST`` find it. Under WSGI a chunked body (no
    Content-Length), which Django itself reads as empty, is read from ``wsgi.input`` when the
    server says it ends there (``wsgi.input_terminated``); under ASGI Django has received the
    whole body (spooled to a file past FILE_UPLOAD_MAX_MEMORY_SIZE) before any view runs."""
    cached: Optional[bytes] = getattr(request, "_body", None)
    if cached is not None:  # request.body was read already
        return cached if len(cached) <= limit else http.too_large(limit)
    if getattr(request, "_read_started", False):  # request.POST or read() came first
        return http.body_unavailable()
    meta = request.META
    if not meta.get("CONTENT_LENGTH") and meta.get("wsgi.input_terminated"):
        read = meta["wsgi.input"].read
    else:
        read = request.read
    body = http.read_bounded(read, limit)
    if body is None:
        return http.too_large(limit)
    # what Django's own request.body keeps: the bytes, and a stream over them for POST
    request._body = body  # type: ignore[attr-defined]
    request._stream = io.BytesIO(body)  # type: ignore[attr-defined]
    return body


def _to_django(response: http.HttpResponse) -> HttpResponse:
    out = HttpResponse(response.body, status=response.status)
    del out["Content-Type"]  # exactly the stored headers, not Django's default
    for name, value in response.headers:
        out[name] = value
    if http.has_body(response.status):
        out["Content-Length"] = str(len(response.body))
    return out


__all__ = ["DjangoIdempotency"]
