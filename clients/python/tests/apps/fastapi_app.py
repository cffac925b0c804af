"""The test application for FastAPI (uvicorn), the asyncio twin of flask_app."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any, Callable, Optional

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request, Response
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from pg_idempotency import AsyncIdempotency, KeyContext, Lease
from pg_idempotency.fastapi import FastAPIIdempotency
from pg_idempotency.http import HttpSettings

from common import (BINARY_BODY, DSN, as_int, charge_body, committed_state, fresh_body,
                    mark_started, order_body, pool_lifespan, released, tenant_of, user_of)


async def until(condition: Callable[[], bool], timeout: float = 120) -> None:
    """common.wait_until without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def create_app() -> FastAPI:
    pool = AsyncConnectionPool(DSN, min_size=4, max_size=80, open=False)
    client = AsyncIdempotency(pool)

    async def current_user(request: Request) -> Optional[str]:  # a coroutine hook works too
        return user_of(request.headers.get("Authorization"))

    idem = FastAPIIdempotency(
        client, caller=current_user,
        tenant=lambda request: tenant_of(request.headers.get("Authorization")))
    by_account = FastAPIIdempotency(
        client, caller=current_user, settings=HttpSettings(fingerprint_headers=["X-Account"]))
    router = APIRouter(route_class=idem.route_class)
    accounts_router = APIRouter(route_class=by_account.route_class)

    def fresh(request: Request) -> Response:
        return Response(fresh_body(user_of(request.headers.get("Authorization"))),
                        status_code=201, media_type="application/json")

    @router.get("/health")
    async def health() -> str:
        return "ok"

    @router.post("/orders", status_code=201)
    @idem.transactional(required=True)
    async def create_order(request: Request,
                           pause: Optional[float] = Header(None, alias="X-Pause"),
                           status: Optional[int] = Header(None, alias="X-Status"),
                           conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        order = await request.json()
        key = request.headers["Idempotency-Key"]
        cur = await conn.execute(
            "INSERT INTO orders (customer, total, idem_key) VALUES (%s, %s, %s) RETURNING id",
            (order["customer"], order["total"], key))
        row = await cur.fetchone()
        assert row is not None
        await conn.execute("INSERT INTO handler_runs (idem_key) VALUES (%s)", (key,))
        if pause:
            mark_started(key)
            await asyncio.sleep(pause)
        return Response(order_body(row[0]), status_code=as_int(status, 201),
                        media_type="application/json",
                        headers={"Location": f"/orders/{row[0]}", "X-Not-Replayed": "1"})

    @router.post("/payments")  # no heartbeat: the tests take the lease over
    @idem.leased(required=True, lease=timedelta(seconds=2), heartbeat=False)
    async def pay(pause: Optional[float] = Header(None, alias="X-Pause"),
                  status: Optional[int] = Header(None, alias="X-Status"),
                  abort: Optional[int] = Header(None, alias="X-Abort"),
                  hold: bool = Header(False, alias="X-Hold"),
                  lease: Lease = Depends(idem.lease)) -> Response:
        async with pool.connection() as conn:
            await conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                               (lease.key, lease.attempt))
        if abort:
            raise HTTPException(abort)
        if pause:
            mark_started(f"{lease.key}.{lease.attempt}")
            await asyncio.sleep(pause)
        if hold:  # until the test releases it
            mark_started(f"{lease.key}.{lease.attempt}")
            await until(lambda: released(f"{lease.key}.{lease.attempt}").exists())
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO provider_charges VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (lease.key, lease.attempt))
        return Response(charge_body(lease.key, lease.attempt), status_code=as_int(status, 201),
                        media_type="application/json")

    @router.post("/payments-held")  # a minute's lease; the handler waits for the test's release
    @idem.leased(required=True, lease=timedelta(minutes=1), heartbeat=False)
    async def pay_held(lease: Lease = Depends(idem.lease)) -> Response:
        async with pool.connection() as conn:
            await conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                               (lease.key, lease.attempt))
        mark_started(f"{lease.key}.{lease.attempt}")
        await until(lambda: released(f"{lease.key}.{lease.attempt}").exists())
        return Response(charge_body(lease.key, lease.attempt), status_code=201,
                        media_type="application/json")

    @router.post("/raise")
    @idem.leased()
    async def explode() -> Response:
        raise RuntimeError("the provider is down")

    @router.post("/heartbeat")  # heartbeats by default (every second)
    @idem.leased(required=True, lease=timedelta(seconds=3))
    async def long_job(pause: float = Header(3, alias="X-Pause"),
                       until_lost: bool = Header(False, alias="X-Until-Lost"),
                       hold: bool = Header(False, alias="X-Hold"),
                       lease: Lease = Depends(idem.lease)) -> Response:
        mark_started(f"{lease.key}.{lease.attempt}")
        if until_lost:
            await until(lambda: lease.lost is not None)
        elif hold:
            await until(lambda: released(f"{lease.key}.{lease.attempt}").exists())
        else:
            await asyncio.sleep(pause)
        return Response(charge_body(lease.key, lease.attempt), status_code=200,
                        media_type="application/json")

    @router.post("/heartbeat-required")
    @idem.leased(required=True, lease=timedelta(seconds=1), heartbeat=True)
    async def heartbeat_required() -> Response:
        return Response(b"{}", status_code=200, media_type="application/json")

    @router.post("/keep")
    @idem.transactional(required=True, keep_writes_on_error=True)
    async def keep(conn: AsyncConnection[Any] = Depends(idem.connection),
                   context: KeyContext = Depends(idem.context)) -> Response:
        await conn.execute("INSERT INTO orders (customer, total, idem_key)"
                           " VALUES ('keep', 1, %s)", (context.key,))
        return Response(b'{"kept": true}', status_code=409, media_type="application/json")

    async def validate(request: Request) -> Optional[Response]:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = {}
        if "customer" not in body:
            return Response(b'{"invalid": true}', status_code=400,
                            media_type="application/json")
        return None

    def on_committed(context: KeyContext, response: Response) -> None:
        # a blocking call in a sync hook: kept short, it is a test
        state = committed_state(context.key)
        response.headers["X-Committed-State"] = state
        if response.headers.get("X-Hook-Fails"):
            raise RuntimeError("the hook failed")

    @router.post("/validated")
    @idem.transactional(required=True, validate=validate, on_committed=on_committed)
    async def validated(request: Request,
                        context: KeyContext = Depends(idem.context)) -> Response:
        body = json.dumps({"key": context.key, "scope": context.scope,
                           "attempt": context.attempt, "inserted": context.inserted})
        headers = {"X-Hook-Fails": "1"} if request.headers.get("X-Fail-Hook") else {}
        return Response(body, status_code=201, media_type="application/json", headers=headers)

    @router.post("/items/{item}")
    @idem.transactional(required=True)
    async def item(item: str, conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(item, status_code=200, media_type="text/plain")

    @router.post("/binary")
    @idem.transactional()
    async def binary(conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(BINARY_BODY, status_code=200, media_type="application/octet-stream")

    @router.post("/small")
    @idem.transactional(required=True, max_body_bytes=1024)
    async def small(request: Request,
                    conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(str(len(await request.body())), status_code=201,
                        media_type="text/plain")

    @router.post("/sized")  # optional key, the default limit; the view reads the body itself
    @idem.transactional()
    async def sized(request: Request,
                    conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(str(len(await request.body())), status_code=201,
                        media_type="text/plain")

    @router.api_route("/things", methods=["GET", "POST", "DELETE"])
    @idem.transactional()
    async def things(request: Request,
                     conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return fresh(request)

    @router.api_route("/things-claimed", methods=["GET", "POST"])
    @idem.transactional(claim_safe_methods=True)
    async def things_claimed(request: Request,
                             conn: AsyncConnection[Any] = Depends(idem.connection)
                             ) -> Response:
        return fresh(request)

    @router.post("/webhook")
    @idem.leased(required=True, public=True)
    async def webhook(request: Request) -> Response:
        return fresh(request)

    @router.post("/cached")
    @idem.transactional(required=True)
    async def cached(request: Request,
                     conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        response = fresh(request)
        response.headers["Cache-Control"] = "no-store"
        return response

    @accounts_router.post("/accounts")
    @by_account.transactional(required=True)
    async def accounts(request: Request,
                       conn: AsyncConnection[Any] = Depends(by_account.connection)
                       ) -> Response:
        return fresh(request)

    app = FastAPI()
    app.include_router(router)
    app.include_router(accounts_router)
    app.router.lifespan_context = pool_lifespan(pool)
    return app
