"""Flask integration: decorators for the two modes over a sync ``Idempotency``.

    idem = FlaskIdempotency(Idempotency(pool))

    @app.post("/orders")
    @idem.transactional(required=True)
    def create_order(conn):            # the transaction's connection: commits with the key
        ...

    @app.post("/payments")
    @idem.leased(lease=timedelta(seconds=30))
    def pay(lease):                    # no transaction open; lease.key for the provider
        ...
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

import flask
from werkzeug.exceptions import HTTPException

from . import errors
from . import http
from .client import Idempotency
from .results import Executed, Reply

View = TypeVar("View", bound=Callable[..., Any])


class FlaskIdempotency(http.RouteDecorators[View]):
    """Idempotency-Key support for Flask views.

    ``tenant``: called during a request, returns the tenant that prefixes the scope (or None).
    ``settings``: header name, fingerprinted request headers, replayed response headers, and
    which statuses are stored as successes, final failures or retryable failures.
    """

    def __init__(self, idempotency: Idempotency, *,
                 tenant: Optional[Callable[[], Optional[str]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
        self.idempotency = idempotency
        self.tenant = tenant
        self.settings = settings

    def _decorator(self, options: http.RouteOptions) -> Callable[[View], View]:
        def decorate(view: View) -> View:
            @functools.wraps(view)
            def wrapper(*args: Any, **kwargs: Any) -> flask.Response:
                return self._handle(options, view, args, kwargs)
            return wrapper  # type: ignore[return-value]
        return decorate

    def _handle(self, options: http.RouteOptions, view: Callable[..., Any],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> flask.Response:
        request = flask.request
        route = request.url_rule.rule if request.url_rule is not None else request.path
        prepared = http.prepare(
            self.settings, options, method=request.method, route=route, path=request.path,
            headers=request.headers, body=request.get_data(cache=True),
            content_type=request.content_type,
            tenant=self.tenant() if self.tenant is not None else None)
        if isinstance(prepared, http.HttpResponse):
            return _to_flask(prepared)
        idem = self.idempotency
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                return flask.make_response(view(*args, lease=None, **kwargs))
            with idem.pool.connection() as conn, conn.transaction():
                return flask.make_response(view(*args, conn=conn, **kwargs))

        produced: list[flask.Response] = []

        def capture(view_call: Callable[[], Any]) -> Reply:
            try:
                rv = view_call()
            except HTTPException as exc:  # abort(404) is an answer, stored like any other
                rv = flask.current_app.handle_http_exception(exc)
            response = flask.make_response(rv)
            produced[:] = [response]
            captured = http.HttpResponse(response.status_code, list(response.headers.items()),
                                         response.get_data())
            return http.reply_for(self.settings, idem.extension(), captured)

        try:
            if options.mode == "transaction":
                result = idem.run_in_transaction(
                    prepared.key, lambda conn: capture(lambda: view(*args, conn=conn, **kwargs)),
                    request=prepared.request, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, wait=options.wait,
                    read_row=False)
            else:
                result = idem.run_with_lease(
                    prepared.key,
                    lambda lease: capture(lambda: view(*args, lease=lease, **kwargs)),
                    request=prepared.request, fingerprint=prepared.fingerprint,
                    scope=prepared.scope, ttl=options.ttl, lease=options.lease,
                    wait=options.wait, heartbeat=options.heartbeat,
                    read_row=False)
        except errors.IdempotencyError as exc:
            answer = http.for_error(exc)
            if answer is None:
                raise
            return _to_flask(answer)
        if isinstance(result, Executed):
            return produced[0]
        return _to_flask(http.for_result(result))


def _to_flask(response: http.HttpResponse) -> flask.Response:
    out = flask.Response(response.body, status=response.status)
    out.headers.clear()  # exactly the stored headers; Content-Length is set from the body
    for name, value in response.headers:
        out.headers.add(name, value)
    out.headers["Content-Length"] = str(len(response.body))
    return out


__all__ = ["FlaskIdempotency"]
