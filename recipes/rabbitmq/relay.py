#!/usr/bin/python3
"""Outbox relay: publishes committed outbox rows to RabbitMQ with publisher confirms and marks them
sent. At-least-once: a row is marked only after the broker confirmed it, so a crash between the
confirm and the mark publishes that batch again on restart, and consumers dedup on message_id.

Each batch is locked with FOR UPDATE SKIP LOCKED, so several relays can run side by side without
publishing the same rows at the same time (ordering across relays is then not kept; see
docs/consumers.md). A batch is published in one go and its confirms awaited together (the broker
writes them to disk together), not one round trip per message. Waits for new rows with LISTEN
outbox, and polls every --poll seconds too.

    PGHOST=... PGDATABASE=... AMQP_URL=amqp://... relay.py [--batch 100] [--poll 1]
        [--crash-after-publish N]

--crash-after-publish N kills the relay with SIGKILL right after the Nth batch was confirmed and
before it is marked sent (fault injection for the end-to-end test). SIGTERM stops it after the
current batch."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Callable

import pika
import pika.exceptions
from pika.adapters.select_connection import PollEvents
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
CONFIRM_TIMEOUT_S = 60


class PublishFailed(pika.exceptions.AMQPError):
    """The broker refused a message of the batch (nack), could not route it (returned), or did not
    confirm it in time: the batch is not marked sent."""


class ConfirmingPublisher:
    """A pika SelectConnection driven step by step: publish a batch, then run the I/O loop until the
    broker confirmed all of it. (pika's BlockingConnection waits for each confirm before the next
    publish: one disk write and one round trip per message.)"""

    def __init__(self, parameters: pika.ConnectionParameters) -> None:
        self.error: Exception | None = None
        self.channel = None
        self.next_tag = 1
        self.unconfirmed: set[int] = set()
        self.done: Callable[[], bool] = lambda: False
        self.connection = pika.SelectConnection(
            parameters, on_open_callback=self._on_open,
            on_open_error_callback=lambda _c, e: self._fail(e),
            on_close_callback=lambda _c, e: self._fail(e))
        self.run_until(lambda: self.channel is not None, CONFIRM_TIMEOUT_S)

    def _on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel) -> None:
        channel.add_on_close_callback(lambda _ch, e: self._fail(e))
        channel.add_on_return_callback(
            lambda *_: self._fail(PublishFailed("a message was returned as unroutable")))
        channel.confirm_delivery(ack_nack_callback=self._on_confirm,
                                 callback=lambda _frame: self._ready(channel))

    def _ready(self, channel) -> None:
        self.channel = channel
        self._check()

    def _on_confirm(self, frame) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self._fail(PublishFailed("the broker nacked a message"))
            return
        if method.multiple:
            self.unconfirmed = {t for t in self.unconfirmed if t > method.delivery_tag}
        else:
            self.unconfirmed.discard(method.delivery_tag)
        self._check()

    def _fail(self, error: Exception) -> None:
        self.error = self.error or error
        self.connection.ioloop.stop()

    def _check(self) -> None:
        if self.done():
            self.connection.ioloop.stop()

    def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Run the I/O loop (heartbeats, confirms) until done() or timeout; raise on an error."""
        self.done = done
        if not done() and self.error is None:
            timer = self.connection.ioloop.call_later(timeout, self.connection.ioloop.stop)
            self.connection.ioloop.start()
            self.connection.ioloop.remove_timeout(timer)
        self.done = lambda: False
        if self.error is not None:
            raise self.error
        if not done():
            raise PublishFailed(f"no confirm within {timeout} s")

    def publish_confirmed(self, messages: list[tuple[str, str, bytes]]) -> None:
        """Publish (message_id, routing_key, body) persistent and mandatory; return when the
        broker confirmed every one."""
        for message_id, routing_key, body in messages:
            self.channel.basic_publish(
                topology.EXCHANGE, routing_key, body,
                pika.BasicProperties(message_id=message_id, delivery_mode=2,
                                     content_type="application/json"),
                mandatory=True)
            self.unconfirmed.add(self.next_tag)
            self.next_tag += 1
        self.run_until(lambda: not self.unconfirmed, CONFIRM_TIMEOUT_S)

    def wait_readable(self, fileno: int, timeout: float) -> None:
        """Serve the connection (heartbeats) until fileno is readable or timeout."""
        readable = [False]

        def on_readable(_fd: int, _events: int) -> None:
            readable[0] = True
            self.connection.ioloop.stop()
        self.connection.ioloop.add_handler(fileno, on_readable, PollEvents.READ)
        try:
            self.done = lambda: readable[0]
            timer = self.connection.ioloop.call_later(timeout, self.connection.ioloop.stop)
            self.connection.ioloop.start()
            self.connection.ioloop.remove_timeout(timer)
        finally:
            self.connection.ioloop.remove_handler(fileno)
            self.done = lambda: False
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()
            self.connection.ioloop.start()  # until the close handshake ends (on_close stops it)

    @property
    def is_closed(self) -> bool:
        return self.error is not None or not self.connection.is_open


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
        self.publisher: ConfirmingPublisher | None = None

    def connect(self) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect()
        if self.listener is None or self.listener.closed:
            self.listener = psycopg.connect(autocommit=True)
            self.listener.execute("LISTEN outbox")
        if self.publisher is None or self.publisher.is_closed:
            with pika.BlockingConnection(topology.amqp_parameters()) as setup:
                topology.declare(setup.channel())
            self.publisher = ConfirmingPublisher(topology.amqp_parameters())

    def disconnect(self) -> None:
        for close in (lambda: self.conn.close(), lambda: self.listener.close(),
                      lambda: self.publisher.close()):
            try:
                close()
            except Exception:  # already broken: nothing to release
                pass
        self.conn = self.listener = self.publisher = None

    def publish_batch(self) -> int:
        """Publish and mark one batch; the number of rows it held."""
        assert self.conn is not None and self.publisher is not None
        t0 = time.monotonic()
        with self.conn.transaction():
            rows = self.conn.execute(FETCH, (self.batch,)).fetchall()
            t1 = time.monotonic()
            if rows:
                self.publisher.publish_confirmed(
                    [(str(message_id), routing_key, payload.encode())
                     for _id, message_id, routing_key, payload in rows])
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
        """Until a NOTIFY outbox or the timeout, keeping the AMQP connection served."""
        assert self.listener is not None and self.publisher is not None
        self.publisher.wait_readable(self.listener.fileno(), timeout)
        pgconn = self.listener.pgconn
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            pass

    def run(self, poll: float) -> None:
        down_since: float | None = None
        while not self.stopping:
            try:
                self.connect()
                if self.publish_batch() == 0:
                    self.wait_for_rows(poll)
                down_since = None
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
    parser.add_argument("--crash-after-publish", type=int, default=0)
    args = parser.parse_args()

    relay = Relay(args.batch, args.crash_after_publish)

    def stop(_signum: int, _frame: object) -> None:
        relay.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    relay.run(args.poll)
    print(json.dumps({"published": relay.published, "batches": relay.batches,
                      "db_s": round(relay.db_s, 3), "broker_s": round(relay.broker_s, 3)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
