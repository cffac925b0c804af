"""The test application for Flask (werkzeug's threaded server)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import flask
from psycopg_pool import ConnectionPool

from pg_idempotency import Idempotency, Lease
from pg_idempotency.flask import FlaskIdempotency
from pg_idempotency.http import HttpSettings

from common import (BINARY_BODY, DSN, as_int, charge_body, committed_state, fresh_body,
                    mark_started, order_body, pause, released, tenant_of, user_of, wait_until)


def create_app() -> flask.Flask:
    app = flask.Flask(__name__)
    pool = ConnectionPool(DSN, min_size=4, max_size=80, open=True)
    client = Idempotency(pool)
    idem = FlaskIdempotency(
        client, caller=lambda request: user_of(request.headers.get("Authorization")),
        tenant=lambda: tenant_of(flask.request.headers.get("Authorization")))
    by_account = FlaskIdempotency(
        client, caller=lambda request: user_of(request.headers.get("Authorization")),
        settings=HttpSettings(fingerprint_headers=["X-Account"]))

    def fresh() -> flask.Response:
        return flask.Response(fresh_body(user_of(flask.request.headers.get("Authorization"))),
                              status=201, content_type="application/json")

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
        if flask.request.headers.get("X-Pause"):
            mark_started(key)
            pause(float(flask.request.headers["X-Pause"]))
        status = as_int(flask.request.headers.get("X-Status"), 201)
        response = flask.Response(order_body(row[0]), status=status,
                                  content_type="application/json")
        response.headers["Location"] = f"/orders/{row[0]}"
        response.headers["X-Not-Replayed"] = "1"
        return response

    @app.post("/payments")  # no heartbeat: the tests take the lease over
    @idem.leased(required=True, lease=timedelta(seconds=2), heartbeat=False)
    def pay(lease: Lease) -> flask.Response:
        with pool.connection() as conn:  # the work's own short transactions
            conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                         (lease.key, lease.attempt))
        if flask.request.headers.get("X-Abort"):
            flask.abort(int(flask.request.headers["X-Abort"]))
        if flask.request.headers.get("X-Pause"):
            mark_started(f"{lease.key}.{lease.attempt}")
            pause(float(flask.request.headers["X-Pause"]))
        if flask.request.headers.get("X-Hold"):  # until the test releases it
            mark_started(f"{lease.key}.{lease.attempt}")
            wait_until(lambda: released(f"{lease.key}.{lease.attempt}").exists(), 120)
        with pool.connection() as conn:  # the provider keeps its own idempotency key
            conn.execute("INSERT INTO provider_charges VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         (lease.key, lease.attempt))
        status = as_int(flask.request.headers.get("X-Status"), 201)
        return flask.Response(charge_body(lease.key, lease.attempt), status=status,
                              content_type="application/json")

    @app.post("/payments-held")  # a minute's lease; the handler waits for the test's release
    @idem.leased(required=True, lease=timedelta(minutes=1), heartbeat=False)
    def pay_held(lease: Lease) -> flask.Response:
        with pool.connection() as conn:
            conn.execute("INSERT INTO handler_runs (idem_key, attempt) VALUES (%s, %s)",
                         (lease.key, lease.attempt))
        mark_started(f"{lease.key}.{lease.attempt}")
        wait_until(lambda: released(f"{lease.key}.{lease.attempt}").exists(), 120)
        return flask.Response(charge_body(lease.key, lease.attempt), status=201,
                              content_type="application/json")

    @app.post("/raise")
    @idem.leased()
    def explode(lease: Lease) -> flask.Response:
        raise RuntimeError("the provider is down")

    @app.post("/heartbeat")  # heartbeats by default (every second)
    @idem.leased(required=True, lease=timedelta(seconds=3))
    def long_job(lease: Lease) -> flask.Response:
        mark_started(f"{lease.key}.{lease.attempt}")
        if flask.request.headers.get("X-Until-Lost"):
            wait_until(lambda: lease.lost is not None)
        elif flask.request.headers.get("X-Hold"):
            wait_until(lambda: released(f"{lease.key}.{lease.attempt}").exists(), 120)
        else:
            pause(float(flask.request.headers.get("X-Pause", "3")))
        return flask.Response(charge_body(lease.key, lease.attempt), status=200,
                              content_type="application/json")

    @app.post("/heartbeat-required")
    @idem.leased(required=True, lease=timedelta(seconds=1), heartbeat=True)
    def heartbeat_required(lease: Lease) -> flask.Response:
        return flask.Response(b"{}", status=200, content_type="application/json")

    @app.post("/keep")
    @idem.transactional(required=True, keep_writes_on_error=True)
    def keep(conn: Any) -> flask.Response:
        conn.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('keep', 1, %s)",
                     (flask.g.idempotency.key,))
        return flask.Response(b'{"kept": true}', status=409, content_type="application/json")

    def validate() -> Any:
        if "customer" not in (flask.request.get_json(silent=True) or {}):
            return flask.Response(b'{"invalid": true}', status=400,
                                  content_type="application/json")
        return None

    def on_committed(context: Any, response: flask.Response) -> None:
        response.headers["X-Committed-State"] = committed_state(context.key)
        if flask.request.headers.get("X-Fail-Hook"):
            raise RuntimeError("the hook failed")

    @app.post("/validated")
    @idem.transactional(required=True, validate=validate, on_committed=on_committed)
    def validated(conn: Any) -> flask.Response:
        context = flask.g.idempotency
        body = json.dumps({"key": context.key, "scope": context.scope,
                           "attempt": context.attempt, "inserted": context.inserted})
        return flask.Response(body, status=201, content_type="application/json")

    @app.before_request
    def parse_form_first() -> None:
        if flask.request.path == "/form-first":
            flask.request.form  # a parser reads the stream without keeping the bytes

    @app.post("/form-first")
    @idem.transactional(required=True)
    def form_first(conn: Any) -> flask.Response:
        return flask.Response(b"{}", status=201, content_type="application/json")

    @app.post("/items/<item>")
    @idem.transactional(required=True)
    def item(item: str, conn: Any) -> flask.Response:
        return flask.Response(item, status=200, content_type="text/plain")

    @app.route("/binary", methods=["POST"])
    @idem.transactional()
    def binary(conn: Any) -> flask.Response:
        return flask.Response(BINARY_BODY, status=200, content_type="application/octet-stream")

    @app.post("/small")
    @idem.transactional(required=True, max_body_bytes=1024)
    def small(conn: Any) -> flask.Response:
        return flask.Response(str(len(flask.request.get_data())), status=201,
                              content_type="text/plain")

    @app.post("/sized")  # optional key, the default limit; the view reads the body itself
    @idem.transactional()
    def sized(conn: Any) -> flask.Response:
        return flask.Response(str(len(flask.request.get_data())), status=201,
                              content_type="text/plain")

    @app.route("/things", methods=["GET", "POST", "DELETE"])
    @idem.transactional()
    def things(conn: Any) -> flask.Response:
        return fresh()

    @app.route("/things-claimed", methods=["GET", "POST"])
    @idem.transactional(claim_safe_methods=True)
    def things_claimed(conn: Any) -> flask.Response:
        return fresh()

    @app.post("/webhook")
    @idem.leased(required=True, public=True)
    def webhook(lease: Lease) -> flask.Response:
        return fresh()

    @app.post("/cached")
    @idem.transactional(required=True)
    def cached(conn: Any) -> flask.Response:
        response = fresh()
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.post("/accounts")
    @by_account.transactional(required=True)
    def accounts(conn: Any) -> flask.Response:
        return fresh()

    return app
