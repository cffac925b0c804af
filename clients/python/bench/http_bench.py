"""Requests per second of one Flask endpoint with the integration against the same endpoint with
minimal hand-written glue (same framework, same database), in interleaved rounds.

    http_bench.py DSN [--seconds 5] [--rounds 3] [--clients 8] [--port 17450]

Workloads: "new" (every request a fresh key: claim, insert, complete, commit) and "replay" (one
key, every request a replay). Two drivers: "wsgi" (one client, Flask's test client in process:
the server's cost left out, the steadiest numbers on a busy machine) and "http" (werkzeug's
threaded server with keep-alive, --clients concurrent httpx clients). Prints the median
requests/s per variant, the ratios, and what one request sends: statements (pg_stat_statements)
and round trips (counted on the wire).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


AUTH = {"Authorization": "Bearer bench"}


def open_pool(dsn: str, size: int = 16) -> Any:
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(dsn, min_size=size, max_size=size, open=True)
    pool.wait()
    return pool


def create_app(pool: Any) -> Any:
    import flask
    from psycopg.types.json import Jsonb

    from pg_idempotency import Idempotency
    from pg_idempotency.flask import FlaskIdempotency

    app = flask.Flask(__name__)
    # the caller is the bearer token as sent: the benchmark measures the library, not a login
    idem = FlaskIdempotency(Idempotency(pool),
                            caller=lambda request: request.headers.get("Authorization"))

    @app.post("/lib/orders")
    @idem.transactional(required=True)
    def with_library(conn: Any) -> Any:
        order = flask.request.get_json()
        (order_id,) = conn.execute("INSERT INTO orders (total) VALUES (%s) RETURNING id",
                                   (order["total"],)).fetchone()
        return {"order_id": order_id}, 201

    @app.post("/glue/orders")
    def by_hand() -> Any:
        # the minimal glue a user writes from the README: no key checks, no byte-exact replay
        key = flask.request.headers["Idempotency-Key"]
        order = flask.request.get_json()
        with pool.connection() as conn, conn.transaction():
            outcome, response, code = conn.execute(
                "SELECT outcome, response, response_code FROM idem_claim(%s, request => %s,"
                " scope => 'POST /glue/orders')", (key, Jsonb(order))).fetchone()
            if outcome == "replay":
                return response, code
            if outcome == "in_progress":
                return {"error": "in progress"}, 409
            (order_id,) = conn.execute("INSERT INTO orders (total) VALUES (%s) RETURNING id",
                                       (order["total"],)).fetchone()
            conn.execute("SELECT FROM idem_complete(%s, %s, 201, scope => 'POST /glue/orders')",
                         (key, Jsonb({"order_id": order_id})))
        return {"order_id": order_id}, 201

    @app.get("/health")
    def health() -> str:
        return "ok"

    return app


def serve(dsn: str, port: int) -> None:
    import logging

    from werkzeug.serving import WSGIRequestHandler, make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    class KeepAlive(WSGIRequestHandler):  # measure requests, not connection set-ups
        protocol_version = "HTTP/1.1"

    make_server("127.0.0.1", port, create_app(open_pool(dsn)), threaded=True,
                request_handler=KeepAlive).serve_forever()


def load_wsgi(app: Any, variant: str, workload: str, seconds: float,
              cpu_per_request: dict[tuple[str, str], list[float]]) -> float:
    """Requests/s of one client in process; appends the Python CPU microseconds per request
    (the application's own cost, which scheduling noise on a busy machine barely moves)."""
    replay_key = f"replay-{variant}-{uuid.uuid4().hex}"
    client = app.test_client()
    body = json.dumps({"total": 42})

    def post(key: str) -> None:
        r = client.post(f"/{variant}/orders", data=body, headers={
            "Idempotency-Key": key, "Content-Type": "application/json", **AUTH})
        assert r.status_code == 201, r.data

    post(replay_key)
    done = 0
    started, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - started < seconds:
        post(replay_key if workload == "replay" else uuid.uuid4().hex)
        done += 1
    cpu_per_request[variant, workload].append((time.process_time() - cpu) / done * 1e6)
    return done / (time.monotonic() - started)


def per_request(dsn: str, variant: str) -> dict[str, tuple[float, float]]:
    """Statements (pg_stat_statements) and round trips (the server's ReadyForQuery messages,
    counted on the wire by a proxy) per request, for a new key and for a replay."""
    import psycopg

    sys.path.insert(0, str(HERE.parent / "tests"))
    from loopback import ExchangeCounter

    query = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
             " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
             " AND query NOT LIKE '%pg_stat_statements%'")
    counts: dict[str, tuple[float, float]] = {}
    with ExchangeCounter(dsn) as wire, open_pool(wire.dsn, 2) as pool, \
            psycopg.connect(dsn, autocommit=True) as conn:
        client = create_app(pool).test_client()
        replay_key = f"count-{variant}-{uuid.uuid4().hex}"

        def post(key: str) -> None:
            r = client.post(f"/{variant}/orders", data='{"total": 42}', headers={
                "Idempotency-Key": key, "Content-Type": "application/json", **AUTH})
            assert r.status_code == 201, r.data

        def statements() -> int:
            return int(conn.execute(query).fetchone()[0])  # type: ignore[index]

        post(replay_key)  # and the library reads the extension's version once
        for workload in ("new", "replay"):
            sent, exchanges = statements(), wire.ready
            for _ in range(100):
                post(replay_key if workload == "replay" else uuid.uuid4().hex)
            counts[workload] = ((statements() - sent) / 100, (wire.ready - exchanges) / 100)
    return counts


def load(base: str, variant: str, workload: str, clients: int, seconds: float) -> float:
    import httpx

    replay_key = f"replay-{variant}-{uuid.uuid4().hex}"
    body = json.dumps({"total": 42})
    with httpx.Client(base_url=base) as warm:  # the replayed key exists before timing
        warm.post(f"/{variant}/orders", content=body, headers={
            "Idempotency-Key": replay_key, "Content-Type": "application/json",
            **AUTH})
    done = [0] * clients
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as c:
            while time.monotonic() < stop:
                key = replay_key if workload == "replay" else uuid.uuid4().hex
                r = c.post(f"/{variant}/orders", content=body, headers={
                    "Idempotency-Key": key, "Content-Type": "application/json", **AUTH})
                assert r.status_code == 201, r.text
                done[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--port", type=int, default=17450)
    parser.add_argument("--driver", choices=("wsgi", "http"), default="wsgi")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.dsn, args.port)
        return

    import httpx
    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY,"
                     " total integer NOT NULL)")
        version = conn.execute("SELECT extversion FROM pg_extension"
                               " WHERE extname = 'idempotency'").fetchone()
    if args.driver == "wsgi":
        sys.path.insert(0, str(HERE.parent / "src"))
        app = create_app(open_pool(args.dsn))
        for variant in ("glue", "lib"):
            for workload, (statements, round_trips) in per_request(args.dsn, variant).items():
                print(f"per request, {variant} {workload}: {statements:.2f} statements, "
                      f"{round_trips:.2f} round trips")
        cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        report(args, version, lambda variant, workload: load_wsgi(app, variant, workload,
                                                                  args.seconds, cpu))
        for workload in ("new", "replay"):
            glue = statistics.median(cpu["glue", workload])
            lib = statistics.median(cpu["lib", workload])
            print(f"  {workload:6}  Python CPU per request: glue {glue:6.0f} us  library "
                  f"{lib:6.0f} us  library / glue {lib / glue:5.2f}")
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    server = subprocess.Popen([sys.executable, __file__, args.dsn, "--serve",
                               "--port", str(args.port)], env=env)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        report(args, version, lambda variant, workload: load(base, variant, workload,
                                                             args.clients, args.seconds))
    finally:
        server.terminate()
        server.wait(10)


def report(args: argparse.Namespace, version: Any, measure: Any) -> None:
    results: dict[tuple[str, str], list[float]] = {}
    for round_no in range(args.rounds):  # interleaved: noise hits every variant alike
        for workload in ("new", "replay"):
            for variant in ("glue", "lib"):
                rps = measure(variant, workload)
                results.setdefault((workload, variant), []).append(rps)
                print(f"round {round_no + 1} {workload:6} {variant:4} {rps:8.1f} req/s",
                      flush=True)
    clients = 1 if args.driver == "wsgi" else args.clients
    print(f"\nextension {version[0] if version else '?'}, driver {args.driver}, {clients} "
          f"client(s), {args.rounds} rounds of {args.seconds:g} s, medians:")
    for workload in ("new", "replay"):
        glue = statistics.median(results[workload, "glue"])
        lib = statistics.median(results[workload, "lib"])
        # a round in which the machine stalled completes no request: no ratio for it
        ratios = [f"{lib_r / glue_r:.2f}" if glue_r else "-"
                  for lib_r, glue_r in zip(results[workload, "lib"], results[workload, "glue"])]
        print(f"  {workload:6}  glue {glue:8.1f}  library {lib:8.1f}  library / glue "
              f"{lib / glue:5.2f} (per round: {', '.join(ratios)})")


if __name__ == "__main__":
    main()
