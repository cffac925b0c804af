"""The test application for Flask (werkzeug's threaded server)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import flask
from psycopg_pool import ConnectionPool

from pg_idempotency import Idempotency, Lease
from pg_idempotency.flask import FlaskIdempotency

from common import (BINARY_BODY, DSN, as_int, charge_body, mark_started, order_body, pause)


def create_app() -> flask.Flask:
    app = flask.Flask(__name__)
    pool = ConnectionPool(DSN, min_size=4, max_size=80, open=True)
    idem = FlaskIdempotency(Idempotency(pool),
                            tenant=lambda: flask.request.headers.get("X-Tenant"))

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/orders")
    @idem.transactional(required=True)
    def create_order(conn: Any) -> flask.Response:
        order = flask.request.get_json()
        key = flask.request.headers["Idempotency-Key"]
        row = conn.execute(
            "INSERT INTO orders (customer, total, idem_key) VALUES (%s, %s, %s) RETURNING id",
            (order["customer"], order["total"], key)).fetchone()
        conn.execute("INSERT INTO handler_runs (idem_key) VALUES (%s)", (key,))
        if flask.request.args.get("pause"):
            mark_started(key)
            pause(float(flask.request.args["pause"]))
        response = flask.Response(order_body(row[0]), status=201,
                                  content_type="application/json")
        response.headers["Location"] = f"/orders/{row[0]}"
        response.headers["X-Not-Replayed"] = "1"
        return response

    @app.post("/payments")
    @idem.leased(required=True, lease=timedelta(seconds=2))
    def pay(lease: Lease) -> flask.Response:
        with pool.connection() as conn:  # the work's own short transactions
            conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                         (lease.key, lease.attempt))
        if flask.request.args.get("abort"):
            flask.abort(int(flask.request.args["abort"]))
        if flask.request.args.get("pause"):
            mark_started(f"{lease.key}.{lease.attempt}")
            pause(float(flask.request.args["pause"]))
        with pool.connection() as conn:  # the provider keeps its own idempotency key
            conn.execute("INSERT INTO provider_charges VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         (lease.key, lease.attempt))
        status = as_int(flask.request.args.get("status"), 201)
        return flask.Response(charge_body(lease.key, lease.attempt), status=status,
                              content_type="application/json")

    @app.post("/raise")
    @idem.leased()
    def explode(lease: Lease) -> flask.Response:
        raise RuntimeError("the provider is down")

    @app.post("/heartbeat")
    @idem.leased(required=True, lease=timedelta(seconds=1), heartbeat=True)
    def long_job(lease: Lease) -> flask.Response:
        mark_started(f"{lease.key}.{lease.attempt}")
        pause(float(flask.request.args.get("pause", "3")))
        return flask.Response(charge_body(lease.key, lease.attempt), status=200,
                              content_type="application/json")

    @app.post("/items/<item>")
    @idem.transactional(required=True)
    def item(item: str, conn: Any) -> flask.Response:
        return flask.Response(item, status=200, content_type="text/plain")

    @app.route("/binary", methods=["POST"])
    @idem.transactional()
    def binary(conn: Any) -> flask.Response:
        return flask.Response(BINARY_BODY, status=200, content_type="application/octet-stream")

    return app
