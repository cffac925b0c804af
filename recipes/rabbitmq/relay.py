#!/usr/bin/python3
"""Outbox relay: publishes committed outbox rows to RabbitMQ with publisher confirms and marks them
sent. At-least-once: a row is marked only after the broker confirmed it, so a crash between the
confirm and the mark publishes that batch again on restart, and consumers dedup on message_id.

Each batch is locked with FOR UPDATE SKIP LOCKED, so several relays can run side by side without
publishing the same rows at the same time (ordering across relays is then not kept; see
docs/consumers.md). Waits for new rows with LISTEN outbox, and polls every --poll seconds too.

    PGHOST=... PGDATABASE=... AMQP_URL=amqp://... relay.py [--batch 100] [--poll 1]
        [--exit-when-empty] [--crash-after-publish N]

--crash-after-publish N kills the relay with SIGKILL right after the Nth batch was confirmed and
before it is marked sent (fault injection for the end-to-end test). SIGTERM stops it after the
current batch."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time

import pika
import pika.exceptions
import psycopg

import topology

FETCH = """SELECT id, message_id, routing_key, payload::text
             FROM outbox
            WHERE sent_at IS NULL
            ORDER BY id
            LIMIT %s
              FOR UPDATE SKIP LOCKED"""
MARK = "UPDATE outbox SET sent_at = now() WHERE id = ANY(%s)"

# Give up after this long without a broker or a database (a supervisor restarts the relay).
RECONNECT_FOR_S = 120


class Relay:
    def __init__(self, batch: int, crash_after_publish: int) -> None:
        self.batch = batch
        self.crash_after_publish = crash_after_publish
        self.batches = 0
        self.published = 0
        self.stopping = False
        self.db_s = 0.0      # time in the database (fetch, mark, commit)
        self.broker_s = 0.0  # time publishing and waiting for confirms
        self.conn: psycopg.Connection | None = None
        self.listener: psycopg.Connection | None = None
        self.amqp: pika.BlockingConnection | None = None
        self.channel = None

    def connect(self) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect()
        if self.listener is None or self.listener.closed:
            self.listener = psycopg.connect(autocommit=True)
            self.listener.execute("LISTEN outbox")
        if self.amqp is None or self.amqp.is_closed:
            self.amqp = pika.BlockingConnection(topology.amqp_parameters())
            self.channel = self.amqp.channel()
            topology.declare(self.channel)
            self.channel.confirm_delivery()

    def disconnect(self) -> None:
        for close in (lambda: self.conn.close(), lambda: self.listener.close(),
                      lambda: self.amqp.close()):
            try:
                close()
            except Exception:  # already broken: nothing to release
                pass
        self.conn = self.listener = self.amqp = self.channel = None

    def publish_batch(self) -> int:
        """Publish and mark one batch; the number of rows it held."""
        assert self.conn is not None and self.channel is not None
        t0 = time.monotonic()
        with self.conn.transaction():
            rows = self.conn.execute(FETCH, (self.batch,)).fetchall()
            t1 = time.monotonic()
            for _id, message_id, routing_key, payload in rows:
                # mandatory: an unroutable message raises UnroutableError instead of vanishing;
                # with confirms on, basic_publish returns once the broker has the message on disk.
                self.channel.basic_publish(
                    topology.EXCHANGE, routing_key, payload.encode(),
                    pika.BasicProperties(message_id=str(message_id), delivery_mode=2,
                                         content_type="application/json"),
                    mandatory=True)
            t2 = time.monotonic()
            if rows:
                self.batches += 1
                if self.batches == self.crash_after_publish:
                    os.kill(os.getpid(), signal.SIGKILL)
                self.conn.execute(MARK, ([r[0] for r in rows],))
        t3 = time.monotonic()
        self.db_s += (t1 - t0) + (t3 - t2)
        self.broker_s += t2 - t1
        self.published += len(rows)
        return len(rows)

    def wait_for_rows(self, timeout: float) -> None:
        """Until a NOTIFY outbox or the timeout, keeping the AMQP heartbeats answered."""
        assert self.listener is not None and self.amqp is not None
        deadline = time.monotonic() + timeout
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([self.listener.fileno()], [], [], min(left, 1.0))
            self.amqp.process_data_events(0)
            if ready:
                pgconn = self.listener.pgconn
                pgconn.consume_input()
                notified = False
                while pgconn.notifies() is not None:
                    notified = True
                if notified:
                    return

    def run(self, poll: float, exit_when_empty: bool) -> None:
        down_since: float | None = None
        while not self.stopping:
            try:
                self.connect()
                down_since = None
                if self.publish_batch() == 0:
                    if exit_when_empty:
                        return
                    self.wait_for_rows(poll)
            except (pika.exceptions.AMQPError, psycopg.OperationalError) as e:
                # The broker or the database went away: nothing was marked for the batch in
                # flight (its transaction rolled back), so it is published again after reconnect.
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > RECONNECT_FOR_S:
                    raise
                print(f"relay: {type(e).__name__}: {e}; reconnecting", file=sys.stderr, flush=True)
                self.disconnect()
                time.sleep(0.5)
        self.disconnect()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--exit-when-empty", action="store_true")
    parser.add_argument("--crash-after-publish", type=int, default=0)
    args = parser.parse_args()

    relay = Relay(args.batch, args.crash_after_publish)

    def stop(_signum: int, _frame: object) -> None:
        relay.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    relay.run(args.poll, args.exit_when_empty)
    print(json.dumps({"published": relay.published, "batches": relay.batches,
                      "db_s": round(relay.db_s, 3), "broker_s": round(relay.broker_s, 3)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
