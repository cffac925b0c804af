"""Django integration: view decorators for the two modes over a sync ``Idempotency``.

    idem = DjangoIdempotency(Idempotency(pool))

    @require_POST
    @idem.transactional(required=True)
    def create_order(request, conn):   # the claim's transaction: write through conn
        ...

    @idem.leased(lease=timedelta(seconds=30))
    def pay(request, lease):           # no transaction open; lease.key for the provider
        ...

``request.idempotency`` is the key, scope and attempt (``KeyContext``, a ``Lease`` in lease
mode; None without a key). Hooks: ``validate(request)`` runs before the key is claimed (a
response it returns is the answer, nothing is stored); ``on_committed(context, response)`` runs
after the result is stored (a success or a final failure), before the answer is sent.

The views write through the psycopg 3 connection they are given: the ORM's connection is not
part of the claim's transaction (Django 3.2, Debian's, reaches PostgreSQL only through psycopg2).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.http import Http404, HttpRequest, HttpResponse, RawPostDataException
from django.http.response import HttpResponseBase

from . import errors
from . import http
from .client import Idempotency
from .lease import KeyContext, Lease
from .results import ClaimResult, Executed, Reply

View = TypeVar("View", bound=Callable[..., Any])


class DjangoIdempotency(http.RouteDecorators[View]):
    """Idempotency-Key support for Django function views.

    ``tenant``: called with the request, returns the tenant that prefixes the scope (or None).
    ``settings``: header name, fingerprinted request headers, replayed response headers, and
    which statuses are stored as successes, final failures or retryable failures.
    """

    def __init__(self, idempotency: Idempotency, *,
                 tenant: Optional[Callable[[HttpRequest], Optional[str]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
        self.idempotency = idempotency
        self.tenant = tenant
        self.settings = settings

    def _decorator(self, options: http.RouteOptions) -> Callable[[View], View]:
        def decorate(view: View) -> View:
            @functools.wraps(view)
            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
                return self._handle(options, view, request, args, kwargs)
            return wrapper  # type: ignore[return-value]
        return decorate

    def _handle(self, options: http.RouteOptions, view: Callable[..., Any],
                request: HttpRequest, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> HttpResponseBase:
        match = request.resolver_match
        route = "/" + match.route if match is not None and match.route else request.path
        try:
            body = request.body
        except RawPostDataException:  # request.POST or the stream was read first
            return _to_django(http.body_unavailable())
        asgi_scope = getattr(request, "scope", None)  # an ASGIRequest keeps the raw path
        meta = request.META
        raw = http.RawRequest(
            method=request.method or "GET",
            target=(http.asgi_target(asgi_scope) if asgi_scope is not None
                    else http.wsgi_target(meta)),
            key_lines=(http.asgi_header_lines(asgi_scope, self.settings.header)
                       if asgi_scope is not None
                       else http.wsgi_key_lines(meta, self.settings.header)),
            content_type=meta.get("CONTENT_TYPE"), header=request.headers.get, body=body)
        prepared = http.prepare(self.settings, options, raw, route=route,
                                tenant=self.tenant(request) if self.tenant is not None else None)
        if isinstance(prepared, http.HttpResponse):
            return _to_django(prepared)
        if options.validate is not None:
            refused = options.validate(request)
            if refused is not None:
                return refused  # type: ignore[no-any-return]
        idem = self.idempotency
        setattr(request, "idempotency", None)
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                response = view(request, *args, lease=None, **kwargs)
            else:
                with idem.pool.connection() as conn, conn.transaction():
                    response = view(request, *args, conn=conn, **kwargs)
            return response  # type: ignore[no-any-return]

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
            return capture(lambda: view(request, *args, lease=lease, **kwargs))

        try:
            if options.mode == "transaction":
                result = idem.run_in_transaction(
                    prepared.key,
                    lambda conn: capture(lambda: view(request, *args, conn=conn, **kwargs)),
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
        if hook is not None:
            http.run_hook(lambda: hook(context, response), "on_committed")


def _to_django(response: http.HttpResponse) -> HttpResponse:
    out = HttpResponse(response.body, status=response.status)
    del out["Content-Type"]  # exactly the stored headers, not Django's default
    for name, value in response.headers:
        out[name] = value
    if http.has_body(response.status):
        out["Content-Length"] = str(len(response.body))
    return out


__all__ = ["DjangoIdempotency"]
