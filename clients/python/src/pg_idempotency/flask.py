"""Flask integration: decorators for the two modes over a sync ``Idempotency``.

    idem = FlaskIdempotency(Idempotency(pool), caller=lambda request: flask.g.user.id)

    @app.post("/orders")
    @idem.transactional(required=True)
    def create_order(conn):            # the transaction's connection: commits with the key
        ...                            # flask.g.idempotency: key, scope, attempt

    @app.post("/payments")
    @idem.leased(lease=timedelta(seconds=30))
    def pay(lease):                    # no transaction open; lease.key for the provider
        ...

Hooks: ``validate()`` runs in the request context before the key is claimed; a return value
other than None is the answer (nothing is stored). ``on_committed(context, response)`` runs
after the result is stored (a success or a final failure), before the answer is sent.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar, Union

import flask
from werkzeug.exceptions import HTTPException

from . import errors
from . import http
from .client import Idempotency
from .lease import KeyContext
from .results import ClaimResult, Executed, Reply

View = TypeVar("View", bound=Callable[..., Any])


class FlaskIdempotency(http.RouteDecorators[View]):
    """Idempotency-Key support for Flask views (docs/http.md).

    ``caller``: called with ``flask.request``, returns who sends it (the authenticated
    principal's id; None or "" when nobody is authenticated: a keyed request is then 401);
    every key is scoped by it. ``public=True`` instead: the routes have no callers (a route
    may also give its own ``caller`` or ``public``; a route without either is a TypeError).
    ``tenant``: called during a request, returns the tenant that prefixes the scope (or None);
    take it from the authenticated principal, never from a header the client chooses.
    ``settings``: header name, fingerprinted request headers, replayed response headers, body
    limit, and which statuses are stored as successes, final failures or retryable failures.
    The handler's context (``KeyContext`` or ``Lease``, None without a key) is
    ``flask.g.idempotency``.
    """

    def __init__(self, idempotency: Idempotency, *,
                 caller: Optional[Callable[[flask.Request], http.CallerId]] = None,
                 public: bool = False,
                 tenant: Optional[Callable[[], Optional[str]]] = None,
                 settings: http.HttpSettings = http.HttpSettings()) -> None:
        http.check_caller(caller, public)
        self.idempotency = idempotency
        self.caller = caller
        self.public = public
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
        prepared = self._prepare(options, request)
        if isinstance(prepared, http.HttpResponse):
            return _to_flask(prepared)
        if options.validate is not None:
            refused = options.validate()
            if refused is not None:
                return flask.make_response(refused)
        idem = self.idempotency
        flask.g.idempotency = None
        if isinstance(prepared, http.UnkeyedRequest):
            if options.mode == "lease":
                response = flask.make_response(view(*args, lease=None, **kwargs))
            else:
                with idem.pool.connection() as conn, conn.transaction():
                    response = flask.make_response(view(*args, conn=conn, **kwargs))
            return response

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

        def claimed(claim: ClaimResult) -> None:
            assert claim.attempt is not None
            flask.g.idempotency = KeyContext(prepared.key, prepared.scope, claim.attempt,
                                             claim.inserted)

        def leased(lease: Any) -> Reply:
            flask.g.idempotency = lease
            return capture(lambda: view(*args, lease=lease, **kwargs))

        try:
            if options.mode == "transaction":
                result = idem.run_in_transaction(
                    prepared.key, lambda conn: capture(lambda: view(*args, conn=conn, **kwargs)),
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
            return _to_flask(answer)
        if isinstance(result, Executed):
            if http.stored(result.reply):
                self._committed(options, flask.g.idempotency, produced[0])
            return produced[0]
        return _to_flask(http.for_result(result))

    def _prepare(self, options: http.RouteOptions, request: flask.Request
                 ) -> Union[http.KeyedRequest, http.UnkeyedRequest, http.HttpResponse]:
        """The key, the caller and the body, checked in that order before the database; the
        body is read only for a keyed request, up to the limit."""
        if not http.claims(options, request.method):
            return http.UnkeyedRequest()
        environ = request.environ
        key = http.read_key(self.settings, options,
                            http.wsgi_key_lines(environ, self.settings.header))
        if not isinstance(key, str):
            return key
        caller = None
        if options.caller is not None:
            caller = http.caller_id(options.caller(request))
            if isinstance(caller, http.HttpResponse):
                return caller
        limit = options.max_body_bytes
        assert limit is not None
        if http.declared_too_large(environ.get("CONTENT_LENGTH"), limit):
            return http.too_large(limit)
        body = _read_body(request, limit)
        if body is None:
            return http.too_large(limit)
        if request.content_length and len(body) != request.content_length:
            return http.body_unavailable()  # a form parser read it first
        route = request.url_rule.rule if request.url_rule is not None else request.path
        return http.keyed(
            self.settings, key, method=request.method, route=route,
            tenant=self.tenant() if self.tenant is not None else None, caller=caller,
            target=http.wsgi_target(environ), content_type=environ.get("CONTENT_TYPE"),
            header=request.headers.get, body=body)

    @staticmethod
    def _committed(options: http.RouteOptions, context: KeyContext,
                   response: flask.Response) -> None:
        hook = options.on_committed
        if hook is not None:
            http.run_hook(lambda: hook(context, response), "on_committed")


def _read_body(request: flask.Request, limit: int) -> Optional[bytes]:
    """The body, read from the request's stream in chunks (None past ``limit``: reading
    stops), and kept where ``get_data()``, ``get_json()`` and the form parser find it."""
    cached: Optional[bytes] = getattr(request, "_cached_data", None)
    if cached is not None:  # the app read it already with get_data(cache=True)
        return cached if len(cached) <= limit else None
    body = http.read_bounded(request.stream.read, limit)
    if body is not None:
        # werkzeug's own cache of get_data(): the view reads these bytes as if it had
        request._cached_data = body  # type: ignore[attr-defined]
    return body


def _to_flask(response: http.HttpResponse) -> flask.Response:
    out = flask.Response(response.body, status=response.status)
    out.headers.clear()  # exactly the stored headers; Content-Length is set from the body
    for name, value in response.headers:
        out.headers.add(name, value)
    if http.has_body(response.status):
        out.headers["Content-Length"] = str(len(response.body))
    return out


__all__ = ["FlaskIdempotency"]
