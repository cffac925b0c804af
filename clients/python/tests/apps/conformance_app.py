"""The conformance vectors' test application (clients/conformance/README.md), for Flask and
FastAPI: every route of every vector, in each of its modes, under the prefix
/<framework>-v<index>-<mode>, served by one handler."""

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
    spelled = r"<\1>" if framework == "flask" else r"{\1}"
    out = []
    for index, vector in enumerate(vectors()):
        for mode in vector["modes"]:
            prefix = PREFIX.format(framework=framework, index=index, mode=mode)
            for route in vector["routes"]:
                out.append((prefix[1:], mode, route,
                            prefix + re.sub(r":(\w+)", spelled, route["template"])))
    return out


def answer(status: int, run: str, runs: int) -> tuple[int, bytes, dict[str, str]]:
    body = (b"" if status in (204, 304)
            else json.dumps({"run": runs, "token": uuid.uuid4().hex}).encode())
    return status, body, {"Content-Type": "application/json", "Location": f"/things/{run}"}


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
            status, body, extra = answer(int(headers.get("X-Test-Status", "201")), run, runs)
            response = flask.Response(body, status=status)
            for name, value in extra.items():
                response.headers[name] = value
            return response
        return view

    for number, (run, mode, route, path) in enumerate(mounted("flask")):
        names = tuple(route.get("fingerprint_headers", ()))
        if names not in integrations:
            integrations[names] = FlaskIdempotency(
                client, settings=HttpSettings(fingerprint_headers=names))
        idem = integrations[names]
        decorate = (idem.transactional(required=route.get("required", False),
                                       keep_writes_on_error=route.get("keep_writes_on_error",
                                                                      False))
                    if mode == "transaction" else idem.leased(required=route.get("required",
                                                                                 False)))
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
        status, body, extra = answer(int(headers.get("X-Test-Status", "201")), run, runs)
        return Response(body, status_code=status, headers=extra)

    for run, mode, route, path in mounted("fastapi"):
        names = tuple(route.get("fingerprint_headers", ()))
        if names not in integrations:
            integrations[names] = FastAPIIdempotency(
                client, settings=HttpSettings(fingerprint_headers=names))
        idem = integrations[names]
        if mode == "transaction":
            def endpoint_for(run: str, idem: Any) -> Callable[..., Any]:
                async def endpoint(request: Request, conn: Any = Depends(idem.connection)
                                   ) -> Response:
                    return await handle(request, run, conn)
                return endpoint
            decorate = idem.transactional(
                required=route.get("required", False),
                keep_writes_on_error=route.get("keep_writes_on_error", False))
        else:
            def endpoint_for(run: str, idem: Any) -> Callable[..., Any]:
                async def endpoint(request: Request) -> Response:
                    return await handle(request, run, None)
                return endpoint
            decorate = idem.leased(required=route.get("required", False))
        app.router.add_api_route(path, decorate(endpoint_for(run, idem)),
                                 methods=[route["method"]],
                                 route_class_override=idem.route_class)

    @app.get("/health")
    async def health() -> str:
        return "ok"

    app.router.lifespan_context = pool_lifespan(pool)
    return app
