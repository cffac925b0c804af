#!/usr/bin/python3
"""Idempotent RabbitMQ consumer: each message's effect and its dedup record commit in one
PostgreSQL transaction, and the message is acknowledged only after that commit.

A broker delivers at least once: after a consumer crash, a lost connection or a relay that
published twice, the same message comes again. The dedup record is an idempotency key
(scope = this consumer group, key = the producer-assigned message id), claimed in the transaction
that applies the effect, with applied => true: the claim itself records the id as applied, so the
record counts only if that transaction commits:
- a new id is claimed and applied; a crash before COMMIT leaves nothing behind, and the
  redelivered message is applied then;
- an id already completed replays: skip the effect, acknowledge again (a crash between COMMIT and
  the ack lands here);
- a duplicate being applied by another consumer right now: the claim waits for that transaction
  and then replays (or claims, if it rolled back).
A poison message (no message id, not JSON, or an effect that fails for good) is recorded as a
failed key and rejected to the dead-letter queue instead of being redelivered forever.

Messages are handled in batches (up to --batch, one transaction): one idem_claim_batch call
claims the batch's ids and records the new ones as applied (one write per id); their effects are
applied next, and the transaction commits.

    PGHOST=... PGDATABASE=... AMQP_URL=amqp://... consumer.py [--batch 100] [--linger 0.05]
        [--crash-after-commit N]

--crash-after-commit N kills the consumer with SIGKILL right after the Nth batch committed and
before it is acknowledged (fault injection for the end-to-end test). SIGTERM stops it after the
current batch; unacknowledged messages go back to the queue."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pika
import pika.exceptions
import psycopg
import psycopg.errors
from psycopg.types.json import Jsonb

import topology

SCOPE = "consumer:shipping"
# How long a dedup record outlives its message: longer than any message can wait in a queue or be
# published again by the relay (docs/consumers.md, "How long to keep ids").
DEDUP_TTL = "7 days"
RECONNECT_FOR_S = 120
# Errors that say "try the same transaction again", not "this message is bad".
TRANSIENT = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
             psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)


@dataclass
class Message:
    tag: int
    message_id: str
    payload: dict[str, Any]


def dedup_claim(conn: psycopg.Connection, messages: list[Message]) -> dict[str, str]:
    """Claim every message's id in the current transaction: message_id -> 'new' (apply it),
    'applied' (done before: skip), 'failed' (dead-lettered before) or 'busy' (owned by a live
    lease elsewhere). One idem_claim_batch call for the whole batch: it takes the ids in key
    order, so consumers claiming overlapping batches cannot deadlock. With applied => true the
    claimed ids are stored as applied already: the caller applies their effects before COMMIT,
    and a rollback undoes both."""
    rows = conn.execute(
        "SELECT key, outcome, state FROM idem_claim_batch(%s, %s, requests => %s, ttl => %s,"
        " applied => true)",
        ([m.message_id for m in messages], SCOPE, [Jsonb(m.payload) for m in messages],
         DEDUP_TTL)).fetchall()
    verdicts = {}
    for key, outcome, state in rows:
        if outcome == "claimed":
            verdicts[key] = "new"
        elif outcome == "replay":
            verdicts[key] = "applied" if state == "succeeded" else "failed"
        else:
            verdicts[key] = "busy"
    return verdicts


def apply_effects(conn: psycopg.Connection, messages: list[Message]) -> None:
    """The business effect of "order created": a shipment per order and the stock it reserves.
    Set-based; stock rows are updated in sku order (consistent lock order across consumers)."""
    conn.execute(
        """INSERT INTO shipments (message_id, order_id, sku, quantity)
           SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::int[])""",
        ([m.message_id for m in messages], [m.payload["order_id"] for m in messages],
         [m.payload["sku"] for m in messages], [m.payload["quantity"] for m in messages]))
    conn.execute(
        """INSERT INTO stock AS s (sku, reserved)
           SELECT sku, sum(quantity) FROM unnest(%s::text[], %s::int[]) AS u (sku, quantity)
            GROUP BY sku ORDER BY sku
           ON CONFLICT (sku) DO UPDATE SET reserved = s.reserved + excluded.reserved""",
        ([m.payload["sku"] for m in messages], [m.payload["quantity"] for m in messages]))


def parse(method: Any, properties: pika.BasicProperties, body: bytes) -> Message | None:
    """A delivery as a Message, or None for one that can never be applied (poison)."""
    try:
        payload = json.loads(body)
        if not properties.message_id or not isinstance(payload, dict):
            return None
        for field, kind in (("order_id", int), ("sku", str), ("quantity", int)):
            if not isinstance(payload.get(field), kind):
                return None
        return Message(method.delivery_tag, properties.message_id, payload)
    except ValueError:
        return None


class Consumer:
    def __init__(self, batch: int, linger: float, crash_after_commit: int) -> None:
        self.batch = batch
        self.linger = linger
        self.crash_after_commit = crash_after_commit
        self.stopping = False
        self.committed_batches = 0
        self.stats = {"applied": 0, "duplicates": 0, "dead_lettered": 0, "requeued": 0, "transactions": 0}
        self.conn: psycopg.Connection | None = None
        self.amqp: pika.BlockingConnection | None = None
        self.channel = None

    def connect(self) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect()
        if self.amqp is None or self.amqp.is_closed:
            self.amqp = pika.BlockingConnection(topology.amqp_parameters())
            self.channel = self.amqp.channel()
            topology.declare(self.channel)
            # Unacknowledged deliveries in flight: one batch being applied, one arriving.
            self.channel.basic_qos(prefetch_count=2 * self.batch)

    def disconnect(self) -> None:
        for close in (lambda: self.conn.close(), lambda: self.amqp.close()):
            try:
                close()
            except Exception:  # already broken: nothing to release
                pass
        self.conn = self.amqp = self.channel = None

    def batches(self) -> Iterator[list[tuple[Any, Any, bytes]]]:
        """Deliveries grouped: up to --batch, or what arrived until the queue was quiet for
        --linger seconds."""
        pending: list[tuple[Any, Any, bytes]] = []
        first_at = 0.0
        for method, properties, body in self.channel.consume(
                topology.QUEUE, inactivity_timeout=self.linger):
            if method is not None:
                if not pending:
                    first_at = time.monotonic()
                pending.append((method, properties, body))
            full = len(pending) >= self.batch
            quiet = method is None or time.monotonic() - first_at >= 4 * self.linger
            if pending and (full or quiet):
                yield pending
                pending = []
            if self.stopping and not pending:
                return

    def apply(self, messages: list[Message]) -> dict[str, str]:
        """One transaction: claim every id (the new ones recorded as applied), apply the new
        ones, COMMIT.
        Returns each message's verdict (see dedup_claim)."""
        assert self.conn is not None
        for attempt in range(1, 6):
            self.stats["transactions"] += 1
            try:
                with self.conn.transaction():
                    verdicts = dedup_claim(self.conn, messages)
                    new = [m for m in messages if verdicts[m.message_id] == "new"]
                    if new:
                        apply_effects(self.conn, new)
                return verdicts
            except TRANSIENT:
                if attempt == 5:
                    raise
        raise AssertionError("unreachable")

    def dead_letter_record(self, message: Message, error: psycopg.Error) -> None:
        """Record a message that fails for good as a failed, non-retryable key, so that its
        duplicates are dead-lettered without running the effect again. Only the SQLSTATE and the
        constraint are stored: never the message or the error's detail (it may quote the row)."""
        assert self.conn is not None
        with self.conn.transaction():
            outcome = self.conn.execute(
                "SELECT outcome FROM idem_claim(%s, request => %s, scope => %s, ttl => %s)",
                (message.message_id, Jsonb(message.payload), SCOPE, DEDUP_TTL)).fetchone()[0]
            if outcome == "claimed":
                self.conn.execute(
                    "SELECT FROM idem_fail(%s, %s, 422, retryable => false, scope => %s)",
                    (message.message_id,
                     Jsonb({"sqlstate": error.sqlstate,
                            "constraint": error.diag.constraint_name}), SCOPE))

    def handle(self, deliveries: list[tuple[Any, Any, bytes]]) -> None:
        verdicts: dict[int, str] = {}  # delivery tag -> new / applied / failed / busy / poison
        messages: list[Message] = []
        # A message published twice can arrive twice in one batch: claim its id once (the batch
        # call answers a repeated id once) and let the copy share the first one's verdict.
        first_of: dict[str, Message] = {}
        copies: list[Message] = []
        for method, properties, body in deliveries:
            message = parse(method, properties, body)
            if message is None:
                verdicts[method.delivery_tag] = "poison"
            elif message.message_id in first_of:
                copies.append(message)
            else:
                first_of[message.message_id] = message
                messages.append(message)
        groups = [messages]
        while groups:
            group = groups.pop()
            if not group:
                continue
            try:
                by_id = self.apply(group)
                for m in group:
                    verdicts[m.tag] = by_id[m.message_id]
            except (psycopg.OperationalError, *TRANSIENT):
                raise
            except psycopg.Error as error:
                # One bad message fails the whole batch. An error about a key's state names the
                # key (COLUMN_NAME); any other error (the effect's) is found by halving the group.
                bad = next((m for m in group if m.message_id == error.diag.column_name), None)
                if bad is None and len(group) > 1:
                    groups.extend([group[:len(group) // 2], group[len(group) // 2:]])
                    continue
                bad = bad or group[0]
                # IK001: the id was used for a different message; the key is not this one's.
                if error.sqlstate != "IK001":
                    self.dead_letter_record(bad, error)
                verdicts[bad.tag] = "poison"
                groups.append([m for m in group if m is not bad])
        for copy in copies:
            first = first_of[copy.message_id]
            if copy.payload != first.payload:  # the id reused for another event: IK001's case
                verdicts[copy.tag] = "poison"
            else:
                verdicts[copy.tag] = {"new": "applied"}.get(verdicts[first.tag], verdicts[first.tag])

        self.committed_batches += 1
        if self.committed_batches == self.crash_after_commit:
            os.kill(os.getpid(), signal.SIGKILL)

        # Only now, after COMMIT, tell the broker.
        for tag, verdict in verdicts.items():
            if verdict in ("new", "applied"):
                self.channel.basic_ack(tag)
                self.stats["applied" if verdict == "new" else "duplicates"] += 1
            elif verdict in ("failed", "poison"):
                self.channel.basic_reject(tag, requeue=False)
                self.stats["dead_lettered"] += 1
            else:  # busy: a lease-mode owner elsewhere; try again later
                self.channel.basic_nack(tag, requeue=True)
                self.stats["requeued"] += 1

    def run(self) -> None:
        down_since: float | None = None
        while not self.stopping:
            try:
                self.connect()
                for deliveries in self.batches():
                    self.handle(deliveries)
                    down_since = None
            except (pika.exceptions.AMQPError, psycopg.OperationalError, *TRANSIENT) as e:
                # Unacknowledged deliveries go back to the queue with the connection; whatever
                # committed is skipped as a duplicate when they come again. A transient database
                # error that outlived apply()'s retries lands here too.
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > RECONNECT_FOR_S:
                    raise
                print(f"consumer: {type(e).__name__}: {e}; reconnecting",
                      file=sys.stderr, flush=True)
                self.disconnect()
                time.sleep(0.5)
        self.disconnect()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--linger", type=float, default=0.05)
    parser.add_argument("--crash-after-commit", type=int, default=0)
    args = parser.parse_args()

    consumer = Consumer(args.batch, args.linger, args.crash_after_commit)

    def stop(_signum: int, _frame: object) -> None:
        consumer.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    consumer.run()
    print(json.dumps(consumer.stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
