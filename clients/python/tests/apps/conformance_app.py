"""The conformance vectors' test application (clients/conformance/README.md), for Flask,
FastAPI and Django (sync views under WSGI, ``async def`` views under WSGI and under ASGI): every route of every
vector, in each of its modes, under the prefix /<framework>-v<index>-<mode>, served by one
handler. The caller of a route is its request's Authorization header as is."""

import asyncio
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from common import DSN, MARKERS, pool_lifespan

PREFIX = "/{framework}-v{index}-{mode}"


def vectors() -> list[dict[str, Any]]:
    with open(os.environ["CONFORMANCE_VECTORS"], encoding="utf-8") as f:
        return list(json.load(f)["vectors"])


def mounted(framework: str) -> list[tuple[str, str, dict[str, Any], str]]:
    """(run, mode, route, path) of every route to mount; ``:name`` is a path parameter."""
    spelled = r"{\1}" if framework == "fastapi" else r"<\1>"
    out = []
    for index, vector in enumerate(vectors()):
        for mode in vector["modes"]:
            prefix = PREFIX.format(framework=framework, index=index, mode=mode)
            for route in vector["routes"]:
                out.append((prefix[1:], mode, route,
                            prefix + re.sub(r":(\w+)", spelled, route["template"])))
    return out


def answer(status: int, run: str, runs: int, cache_control: Optional[str]
           ) -> tuple[int, bytes, dict[str, str]]:
    body = (b"" if status in (204, 304)
            else json.dumps({"run": runs, "token": uuid.uuid4().hex}).encode())
    headers = {"Content-Type": "application/json", "Location": f"/things/{run}"}
    if cache_control is not None:
        headers["Cache-Control"] = cache_control
    return status, body, headers


def route_options(route: dict[str, Any], mode: str) -> dict[str, Any]:
    """The decorator's arguments for a vector's route."""
    options: dict[str, Any] = {
        "required": route.get("required", False), "public": route.get("public", False),
        "claim_safe_methods": route.get("claim_safe_methods", False),
        "max_body_bytes": route.get("max_body_bytes")}
    if mode == "transaction":
        options["keep_writes_on_error"] = route.get("keep_writes_on_error", False)
    return options


def held(run: str) -> Path:
    return MARKERS / f"{run}.held"


def released(run: str) -> Path:
    return MARKERS / f"{run}.release"


START = "INSERT INTO conformance_starts (run) VALUES (%s) RETURNING" \
        " (SELECT count(*) + 1 FROM conformance_starts WHERE run = %s)"
WRITE = "INSERT INTO conformance_writes (run) VALUES (%s)"


def create_flask() -> Any:
    import flask
    from psycopg_pool import ConnectionPool

    from pg_idempotency import Idempotency
    from pg_idempotency.flask import FlaskIdempotency
    from pg_idempotency.http import HttpSettings

    app = flask.Flask(__name__)
    pool = ConnectionPool(DSN, min_size=2, max_size=40, open=True)
    client = Idempotency(pool)
    integrations: dict[tuple[str, ...], Any] = {}

    def view_for(run: str) -> Callable[..., Any]:
        def view(conn: Any = None, lease: Any = None, **path: str) -> flask.Response:
            with pool.connection() as own:  # counted even when the claim's work rolls back
                runs = own.execute(START, (run, run)).fetchone()[0]
            headers = flask.request.headers
            if headers.get("X-Test-Hold"):
                held(run).write_text("held")
                deadline = time.monotonic() + 120
                while not released(run).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
            if conn is not None:
                conn.execute(WRITE, (run,))
            if headers.get("X-Test-Throw"):
                raise RuntimeError("the handler throws, as the vector asks")
            status, body, extra = answer(int(headers.get("X-Test-Status", "201")), run, runs,
                                         headers.get("X-Test-Cache-Control"))
            response = flask.Response(body, status=status)
            for name, value in extra.items():
                response.headers[name] = value
            return response
        return view

    for number, (run, mode, route, path) in enumerate(mounted("flask")):
        names = tuple(route.get("fingerprint_headers", ()))
        if names not in integrations:
            integrations[names] = FlaskIdempotency(
                client, caller=lambda request: request.headers.get("Authorization"),
                settings=HttpSettings(fingerprint_headers=names))
        idem = integrations[names]
        decorate = (idem.transactional if mode == "transaction" else idem.leased)(
            **route_options(route, mode))
        app.add_url_rule(path, endpoint=f"route{number}", view_func=decorate(view_for(run)),
                         methods=[route["method"]])

    @app.get("/health")
    def health() -> str:
        return "ok"

    return app


def create_fastapi() -> Any:
    from fastapi import Depends, FastAPI, Request, Response
    from psycopg_pool import AsyncConnectionPool

    from pg_idempotency import AsyncIdempotency
    from pg_idempotency.fastapi import FastAPIIdempotency
    from pg_idempotency.http import HttpSettings

    pool = AsyncConnectionPool(DSN, min_size=2, max_size=40, open=False)
    client = AsyncIdempotency(pool)
    integrations: dict[tuple[str, ...], Any] = {}
    app = FastAPI()

    async def handle(request: Request, run: str, conn: Optional[Any]) -> Response:
        async with pool.connection() as own:  # counted even when the claim's work rolls back
            runs = (await (await own.execute(START, (run, run))).fetchone())[0]
        headers = request.headers
        if headers.get("X-Test-Hold"):
            held(run).write_text("held")
            deadline = time.monotonic() + 120
            while not released(run).exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        if conn is not None:
            await conn.execute(WRITE, (run,))
        if headers.get("X-Test-Throw"):
            raise RuntimeError("the handler throws, as the vector asks")
        status, body, extra = answer(int(headers.get("X-Test-Status", "201")), run, runs,
                                     headers.get("X-Test-Cache-Control"))
        return Response(body, status_code=status, headers=extra)

    for run, mode, route, path in mounted("fastapi"):
        names = tuple(route.get("fingerprint_headers", ()))
        if names not in integrations:
            integrations[names] = FastAPIIdempotency(
                client, caller=lambda request: request.headers.get("Authorization"),
                settings=HttpSettings(fingerprint_headers=names))
        idem = integrations[names]
        if mode == "transaction":
            def endpoint_for(run: str, idem: Any) -> Callable[..., Any]:
                async def endpoint(request: Request, conn: Any = Depends(idem.connection)
                                   ) -> Response:
                    return await handle(request, run, conn)
                return endpoint
            decorate = idem.transactional(**route_options(route, mode))
        else:
            def endpoint_for(run: str, idem: Any) -> Callable[..., Any]:
                async def endpoint(request: Request) -> Response:
                    return await handle(request, run, None)
                return endpoint
            decorate = idem.leased(**route_options(route, mode))
        app.router.add_api_route(path, decorate(endpoint_for(run, idem)),
                                 methods=[route["method"]],
                                 route_class_override=idem.route_class)

    @app.get("/health")
    async def health() -> str:
        return "ok"

    app.router.lifespan_context = pool_lifespan(pool)
    return app


#: the Django application's URLconf (ROOT_URLCONF names this module), filled by create_django
urlpatterns: list[Any] = []


def create_django(asynchronous: bool, wsgi: bool) -> Any:
    """The WSGI or the ASGI application, with sync or ``async def`` views."""
    import django
    from django.conf import settings

    settings.configure(DEBUG=False, ALLOWED_HOSTS=["127.0.0.1"], ROOT_URLCONF=__name__,
                       DATABASES={}, MIDDLEWARE=[], SECRET_KEY="tests-only", USE_TZ=True,
                       LOGGING_CONFIG=None)
    django.setup()
    from asgiref.sync import sync_to_async
    from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
    from django.urls import path as django_path
    from psycopg_pool import ConnectionPool

    from pg_idempotency import Idempotency
    from pg_idempotency.django import DjangoIdempotency
    from pg_idempotency.http import HttpSettings

    pool = ConnectionPool(DSN, min_size=2, max_size=40, open=True)
    client = Idempotency(pool)
    integrations: dict[tuple[str, ...], Any] = {}

    def started(run: str) -> int:
        with pool.connection() as own:  # counted even when the claim's work rolls back
            return int(own.execute(START, (run, run)).fetchone()[0])

    def respond(request: HttpRequest, run: str, runs: int) -> HttpResponse:
        headers = request.headers
        if headers.get("X-Test-Throw"):
            raise RuntimeError("the handler throws, as the vector asks")
        status, body, extra = answer(int(headers.get("X-Test-Status", "201")), run, runs,
                                     headers.get("X-Test-Cache-Control"))
        response = HttpResponse(body, status=status)
        for name, value in extra.items():
            response[name] = value
        return response

    def sync_view(run: str) -> Any:
        def view(request: HttpRequest, conn: Any = None, lease: Any = None, **path: str
                 ) -> HttpResponse:
            runs = started(run)
            if request.headers.get("X-Test-Hold"):
                held(run).write_text("held")
                deadline = time.monotonic() + 120
                while not released(run).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
            if conn is not None:
                conn.execute(WRITE, (run,))
            return respond(request, run, runs)
        return view

    def async_view(run: str) -> Any:
        async def view(request: HttpRequest, conn: Any = None, lease: Any = None, **path: str
                       ) -> HttpResponse:
            runs = await sync_to_async(started)(run)
            if request.headers.get("X-Test-Hold"):
                held(run).write_text("held")
                deadline = time.monotonic() + 120
                while not released(run).exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            if conn is not None:  # the claim's connection is sync: called as Django's ORM is
                await sync_to_async(conn.execute)(WRITE, (run,))
            return respond(request, run, runs)
        return view

    by_path: dict[str, dict[str, Any]] = {}
    framework = ("django-wsgi" if wsgi else "django-asgi") + ("-async" if asynchronous
                                                             and wsgi else "")
    for run, mode, route, path in mounted(framework):
        names = tuple(route.get("fingerprint_headers", ()))
        if names not in integrations:
            integrations[names] = DjangoIdempotency(
                client, caller=lambda request: request.headers.get("Authorization"),
                settings=HttpSettings(fingerprint_headers=names))
        idem = integrations[names]
        decorate = (idem.transactional if mode == "transaction" else idem.leased)(
            **route_options(route, mode))
        view = async_view(run) if asynchronous else sync_view(run)
        by_path.setdefault(path, {})[route["method"]] = decorate(view)

    def dispatch(views: dict[str, Any]) -> Any:
        """One Django view per path: the vector's routes by method."""
        if asynchronous:
            async def by_method(request: HttpRequest, **path: str) -> Any:
                chosen = views.get(request.method or "")
                if chosen is None:
                    return HttpResponseNotAllowed(list(views))
                return await chosen(request, **path)
            return by_method

        def by_method_sync(request: HttpRequest, **path: str) -> Any:
            chosen = views.get(request.method or "")
            if chosen is None:
                return HttpResponseNotAllowed(list(views))
            return chosen(request, **path)
        return by_method_sync

    def health(request: HttpRequest) -> HttpResponse:
        return HttpResponse(b"ok")

    urlpatterns[:] = [django_path("health", health)] + [
        django_path(path[1:], dispatch(views)) for path, views in by_path.items()]
    if wsgi:
        from django.core.wsgi import get_wsgi_application
        return get_wsgi_application()
    from django.core.asgi import get_asgi_application
    return get_asgi_application()
