#!/usr/bin/python3
"""Producer side of the transactional outbox: an order endpoint made idempotent with the
extension. The business write, the outbox row (the event to publish) and idem_complete commit in
one transaction, so an event exists exactly for the requests that committed, and a retried request
gets its stored response back without writing a second order or a second event.

    PGHOST=... PGDATABASE=... producer.py --requests 1000 [--first 1] [--fail-every N]
        [--duplicate-every N] [--poison-every N]

Without options it places --requests orders with idempotency keys "order-<first>".."order-<last>".
The other options drive the end-to-end test: roll back the first try of every Nth request and
retry it (a crash before commit), send every Nth request twice (a client retry after a lost
response), and give every Nth order a quantity the consumer refuses (a poison message). Prints one
JSON line of counts at the end."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SCOPE = "POST /orders"
ROUTING_KEY = "order.created"


class SimulatedCrash(Exception):
    """Raised inside the transaction to roll it back as a crash before COMMIT would."""


def place_order(conn: psycopg.Connection, key: str, request: dict[str, Any],
                crash_before_commit: bool = False) -> tuple[int, dict[str, Any]]:
    """Handle one `POST /orders` with its Idempotency-Key: (status, response body)."""
    with conn.transaction():
        claim = conn.execute(
            "SELECT outcome, response, response_code, retry_after"
            "  FROM idem_claim(%s, request => %s, scope => %s)",
            (key, Jsonb(request), SCOPE)).fetchone()
        outcome, response, response_code, retry_after = claim
        if outcome == "replay":
            return response_code, response
        if outcome == "in_progress":  # only with lease-mode claims; this endpoint uses none
            return 409, {"retry_after_s": retry_after.total_seconds()}
        # claimed: the order and its event, in this transaction
        message_id, order_id = conn.execute(
            """WITH o AS (INSERT INTO orders (customer, sku, quantity) VALUES (%s, %s, %s)
                          RETURNING id, customer, sku, quantity)
               INSERT INTO outbox (routing_key, payload)
               SELECT %s, jsonb_build_object('order_id', id, 'customer', customer,
                                             'sku', sku, 'quantity', quantity)
                 FROM o
               RETURNING message_id, (payload->>'order_id')::bigint""",
            (request["customer"], request["sku"], request["quantity"], ROUTING_KEY)).fetchone()
        body = {"order_id": order_id, "event": str(message_id)}
        conn.execute("SELECT FROM idem_complete(%s, %s, 201, scope => %s)",
                     (key, Jsonb(body), SCOPE))
        if crash_before_commit:
            raise SimulatedCrash
        return 201, body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--duplicate-every", type=int, default=0)
    parser.add_argument("--poison-every", type=int, default=0)
    args = parser.parse_args()

    def every(n: int, i: int) -> bool:
        return n > 0 and i % n == 0

    counts = {"created": 0, "replayed": 0, "rolled_back": 0, "poison": 0}
    with psycopg.connect() as conn:
        for i in range(args.first, args.first + args.requests):
            key = f"order-{i}"
            poison = every(args.poison_every, i)
            request = {"customer": f"c{i % 97}", "sku": f"sku-{i % 10}",
                       "quantity": 0 if poison else 1 + i % 3}
            if every(args.fail_every, i):
                try:
                    place_order(conn, key, request, crash_before_commit=True)
                except SimulatedCrash:
                    counts["rolled_back"] += 1
            status, body = place_order(conn, key, request)
            if status != 201:
                print(f"producer: {key}: expected 201, got {status}", file=sys.stderr)
                return 1
            counts["created"] += 1
            counts["poison"] += poison
            if every(args.duplicate_every, i):
                again = place_order(conn, key, request)
                if again != (status, body):
                    print(f"producer: {key}: the retry got {again}, not {(status, body)}",
                          file=sys.stderr)
                    return 1
                counts["replayed"] += 1
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
