"""The test application for FastAPI (uvicorn), the asyncio twin of flask_app."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Optional

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from pg_idempotency import AsyncIdempotency, Lease
from pg_idempotency.fastapi import FastAPIIdempotency

from common import BINARY_BODY, DSN, as_int, charge_body, mark_started, order_body


def create_app() -> FastAPI:
    pool = AsyncConnectionPool(DSN, min_size=4, max_size=80, open=False)
    idem = FastAPIIdempotency(AsyncIdempotency(pool),
                              tenant=lambda request: request.headers.get("X-Tenant"))
    router = APIRouter(route_class=idem.route_class)

    @router.get("/health")
    async def health() -> str:
        return "ok"

    @router.post("/orders", status_code=201)
    @idem.transactional(required=True)
    async def create_order(request: Request, pause: Optional[float] = None,
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
        return Response(order_body(row[0]), status_code=201, media_type="application/json",
                        headers={"Location": f"/orders/{row[0]}", "X-Not-Replayed": "1"})

    @router.post("/payments")
    @idem.leased(required=True, lease=timedelta(seconds=2))
    async def pay(pause: Optional[float] = None, status: Optional[int] = None,
                  abort: Optional[int] = None, lease: Lease = Depends(idem.lease)) -> Response:
        async with pool.connection() as conn:
            await conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                               (lease.key, lease.attempt))
        if abort:
            raise HTTPException(abort)
        if pause:
            mark_started(f"{lease.key}.{lease.attempt}")
            await asyncio.sleep(pause)
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO provider_charges VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (lease.key, lease.attempt))
        return Response(charge_body(lease.key, lease.attempt), status_code=as_int(status, 201),
                        media_type="application/json")

    @router.post("/raise")
    @idem.leased()
    async def explode() -> Response:
        raise RuntimeError("the provider is down")

    @router.post("/heartbeat")
    @idem.leased(required=True, lease=timedelta(seconds=1), heartbeat=True)
    async def long_job(pause: float = 3, lease: Lease = Depends(idem.lease)) -> Response:
        mark_started(f"{lease.key}.{lease.attempt}")
        await asyncio.sleep(pause)
        return Response(charge_body(lease.key, lease.attempt), status_code=200,
                        media_type="application/json")

    @router.post("/items/{item}")
    @idem.transactional(required=True)
    async def item(item: str, conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(item, status_code=200, media_type="text/plain")

    @router.post("/binary")
    @idem.transactional()
    async def binary(conn: AsyncConnection[Any] = Depends(idem.connection)) -> Response:
        return Response(BINARY_BODY, status_code=200, media_type="application/octet-stream")

    app = FastAPI()
    app.include_router(router)
    app.add_event_handler("startup", pool.open)
    app.add_event_handler("shutdown", pool.close)
    return app
