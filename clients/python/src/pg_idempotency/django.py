"""Django integration: view decorators for the two modes over a sync ``Idempotency``.

    idem = DjangoIdempotency(Idempotency(pool))

    @require_POST
    @idem.transactional(required=True)
    def create_order(request, conn):   # the claim's transaction: write through conn
        ...

    @idem.leased(lease=timedelta(seconds=30))
    def pay(request, lease):           # no transaction open; lease.key for the provider
        ...

The views write through the psycopg 3 connection they are given: the ORM's connection is not
part of the claim's transaction (Django 3.2, Debian's, reaches PostgreSQL only through psycopg2).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.core.handlers.exception import response_for_exception
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from . import errors
from . import http
from .client import Idempotency
from .results import Executed, Reply

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
        prepared = http.prepare(
            self.settings, options, method=request.method or "GET", route=route,
            path=request.path, headers=request.headers, body=request.body,
            content_type=request.META.get("CONTENT_TYPE"),
            tenant=self.tenant(request) if self.tenant is not None else None)
        if isinstance(prepared, http.HttpResponse):
            return _to_django(prepared)
        idem = self.idempotency
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                return view(request, *args, lease=None, **kwargs)
            with idem.pool.connection() as conn, conn.transaction():
                return view(request, *args, conn=conn, **kwargs)

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

        try:
            if options.mode == "transaction":
                result = idem.run_in_transaction(
                    prepared.key,
                    lambda conn: capture(lambda: view(request, *args, conn=conn, **kwargs)),
                    request=prepared.request, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, wait=options.wait, read_row=False)
            else:
                result = idem.run_with_lease(
                    prepared.key,
                    lambda lease: capture(lambda: view(request, *args, lease=lease, **kwargs)),
                    request=prepared.request, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, lease=options.lease,
                    wait=options.wait, heartbeat=options.heartbeat, read_row=False)
        except errors.IdempotencyError as exc:
            answer = http.for_error(exc)
            if answer is None:
                raise
            return _to_django(answer)
        if isinstance(result, Executed):
            return produced[0]
        return _to_django(http.for_result(result))


def _to_django(response: http.HttpResponse) -> HttpResponse:
    out = HttpResponse(response.body, status=response.status)
    del out["Content-Type"]  # exactly the stored headers, not Django's default
    for name, value in response.headers:
        out[name] = value
    out["Content-Length"] = str(len(response.body))
    return out


__all__ = ["DjangoIdempotency"]
