#!/usr/bin/python3
"""End-to-end test of the recipe against a real PostgreSQL and a real RabbitMQ (TAP output, last
line "N passed, N failed").

10,000 orders go through producer -> outbox -> relay -> RabbitMQ -> two consumers, while:
- the relay is killed with SIGKILL after a batch was confirmed by the broker and before it was
  marked sent (the batch is published twice);
- a consumer is killed with SIGKILL after a batch committed and before it was acknowledged (the
  batch is delivered again);
- the broker node is stopped and started again (durable queue, persistent messages);
- the producer rolls back some first tries, answers some client retries from the stored response,
  and creates some orders the consumer refuses (poison messages).
Then, from the database: every committed order's event applied exactly once (0 lost, 0 applied
twice, 0 applied without a committed order), poison events applied never and dead-lettered, stock
totals equal to the sum of the applied orders. Last, one batch with two bad messages (an id
reused for another event, an effect the check constraint refuses): the rest applied, the two
dead-lettered, in far fewer transactions than one per message.

Environment: PG_CONFIG, MESSAGES (default 10000); IDEMPOTENCY_PORTS (the range of the free ports).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

import servers
import topology

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
MESSAGES = int(os.environ.get("MESSAGES", "10000"))
FAIL_EVERY, DUPLICATE_EVERY, POISON_EVERY = 50, 20, 1000
PRODUCERS = 4
DEADLINE_S = 360


class Tap:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def ok(self, condition: bool, name: str, diagnostic: str = "") -> bool:
        n = self.passed + self.failed + 1
        print(f"{'ok' if condition else 'not ok'} {n} - {name}", flush=True)
        if not condition and diagnostic:
            for line in diagnostic.splitlines():
                print(f"#   {line}", flush=True)
        if condition:
            self.passed += 1
        else:
            self.failed += 1
        return condition

    def is_(self, got: object, expected: object, name: str) -> bool:
        return self.ok(got == expected, name, f"got:      {got!r}\nexpected: {expected!r}")


def note(message: str) -> None:
    print(f"# {message}", flush=True)


class Processes:
    """The recipe's processes, with their output in files, all killed at the end."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.env = env
        self.running: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        self.count += 1
        out = self.base / f"{self.count:02d}-{name}.out"
        with open(out, "wb") as f:
            p = subprocess.Popen([PYTHON, str(HERE / f"{name}.py"), *args], env=self.env,
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.running.append(p)
        return p, out

    def stop_all(self) -> None:
        for p in self.running:
            if p.poll() is None:
                p.terminate()
        for p in self.running:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def last_json(path: Path) -> dict[str, int]:
    for line in reversed(path.read_text().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no result line in {path}")


def publish(broker: servers.RabbitMQ, messages: list[tuple[str | None, bytes]]) -> None:
    """Persistent messages (message id, body), each confirmed by the broker, in this order."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as c:
        ch = c.channel()
        topology.declare(ch)
        ch.confirm_delivery()
        for message_id, body in messages:
            ch.basic_publish(topology.EXCHANGE, topology.ROUTING_KEY, body,
                             pika.BasicProperties(delivery_mode=2, message_id=message_id))


def wait_until(predicate, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def main() -> int:
    tap = Tap()
    base = Path(tempfile.mkdtemp(prefix="idem-rabbitmq-"))
    pg = servers.Postgres(base)
    broker = servers.RabbitMQ(base)
    procs: Processes | None = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    try:
        pg.start({"fsync": "off"})
        pg.psql("postgres", "CREATE DATABASE recipe")
        pg.psql("recipe", (HERE / "schema.sql").read_text())
        broker.start()
        note(f"servers up in {time.monotonic() - started:.1f} s (work directory {base})")

        env = dict(os.environ, AMQP_URL=broker.url, PYTHONPATH=str(HERE), **pg.env("recipe"))
        procs = Processes(base, env)
        sql = lambda q: pg.psql("recipe", q)

        # Before the consumers start: a message that is not even JSON, without a message id
        # (straight to the dead letters), and one order whose event is published twice in a row
        # (both copies land in one consumer's batch).
        twice_id, twice_payload = sql(
            """WITH o AS (INSERT INTO orders (customer, sku, quantity)
                          VALUES ('twice', 'sku-1', 2) RETURNING *)
               INSERT INTO outbox (routing_key, payload, sent_at)
               SELECT 'order.created', jsonb_build_object('order_id', id, 'customer', customer,
                                                          'sku', sku, 'quantity', quantity), now()
                 FROM o
               RETURNING message_id, payload""").split("|")
        publish(broker, [(None, b"\x00not json")] + [(twice_id, twice_payload.encode())] * 2)

        consumer_a, consumer_a_out = procs.start("consumer", "--crash-after-commit", "5")
        consumer_b, consumer_b_out = procs.start("consumer")
        relay, relay_out = procs.start("relay", "--crash-after-publish", "10")
        # Four producers (web workers), each with its own range of idempotency keys.
        share = MESSAGES // PRODUCERS
        producers = [procs.start(
            "producer", "--first", str(1 + k * share),
            "--requests", str(share if k < PRODUCERS - 1 else MESSAGES - k * share),
            "--fail-every", str(FAIL_EVERY), "--duplicate-every", str(DUPLICATE_EVERY),
            "--poison-every", str(POISON_EVERY)) for k in range(PRODUCERS)]
        producing = lambda: any(p.poll() is None for p, _ in producers)

        tap.ok(wait_until(lambda: relay.poll() is not None, 120), "the relay was killed "
               "between publish and mark", relay_out.read_text()[-2000:])
        tap.is_(relay.returncode, -signal.SIGKILL, "... by SIGKILL")
        relay, relay_out = procs.start("relay")
        tap.ok(wait_until(lambda: consumer_a.poll() is not None, 120), "a consumer was killed "
               "between commit and ack", consumer_a_out.read_text()[-2000:])
        tap.is_(consumer_a.returncode, -signal.SIGKILL, "... by SIGKILL")
        consumer_a, consumer_a_out = procs.start("consumer")

        applied = lambda: int(sql("SELECT count(*) FROM shipments"))
        wait_until(lambda: applied() >= MESSAGES // 3 or not producing(), 240)
        before_restart = applied()
        t = time.monotonic()
        broker.restart()
        note(f"broker restarted in {time.monotonic() - t:.1f} s, {before_restart} events applied "
             f"before the restart")
        tap.ok(before_restart < MESSAGES - MESSAGES // POISON_EVERY,
               "the broker restarted while events were still flowing")

        tap.ok(wait_until(lambda: not producing(), DEADLINE_S), "the producers finished",
               "".join(out.read_text()[-1000:] for _, out in producers))
        tap.is_([p.returncode for p, _ in producers], [0] * PRODUCERS,
                "the producers' responses and replays were all as stored")
        produced = {}
        for _, out in producers:
            for name, count in last_json(out).items():
                produced[name] = produced.get(name, 0) + count
        note(f"producers: {produced}")
        poison = produced["poison"]

        # Done when every event is sent, and every event's key is finished in the consumer's scope
        # and nothing is left in the queue.
        def drained() -> bool:
            left = sql("""SELECT (SELECT count(*) FROM outbox WHERE sent_at IS NULL)
                               + (SELECT count(*) FROM outbox o WHERE NOT EXISTS (
                                    SELECT FROM idem_keys k WHERE k.scope = 'consumer:shipping'
                                       AND k.key = o.message_id::text AND k.state <> 'pending'))""")
            return int(left) == 0 and broker.queue_depth(topology.QUEUE) == 0
        tap.ok(wait_until(drained, DEADLINE_S, 1.0), "every event was sent and consumed")

        # Stop everything gracefully, then read the counts they print on the way out.
        for p in (relay, consumer_a, consumer_b):
            p.terminate()
        for p in (relay, consumer_a, consumer_b):
            p.wait(timeout=60)
        tap.ok(all(p.returncode == 0 for p in (relay, consumer_a, consumer_b)),
               "relay and consumers stopped cleanly on SIGTERM")
        consumed = [last_json(consumer_a_out), last_json(consumer_b_out)]
        note(f"consumers: {consumed}; relay: {last_json(relay_out)}")

        # ---- the verdict, from the database
        orders = int(sql("SELECT count(*) FROM orders"))
        tap.is_(orders, MESSAGES + 1,
                "one order per request (rolled-back tries and retries wrote none)")
        tap.is_(int(sql("SELECT count(*) FROM outbox")), orders, "one outbox event per order")
        tap.is_(int(sql("SELECT count(DISTINCT (payload->>'order_id')) FROM outbox")), orders,
                "... each for a different order")
        tap.is_(int(sql("SELECT count(*) FROM idem_keys WHERE scope = 'POST /orders' "
                        "AND state = 'succeeded'")), MESSAGES, "every request's key succeeded")
        tap.is_(sql(f"SELECT count(*) FROM shipments WHERE message_id = '{twice_id}'"), "1",
                "an event delivered twice in one batch was applied once")
        lost = int(sql("""SELECT count(*) FROM outbox o JOIN orders r ON r.id = (o.payload->>'order_id')::bigint
                           WHERE r.quantity > 0
                             AND NOT EXISTS (SELECT FROM shipments s WHERE s.message_id = o.message_id)"""))
        tap.is_(lost, 0, "0 events lost")
        twice = int(sql("""SELECT count(*) FROM (SELECT message_id FROM shipments
                            GROUP BY message_id HAVING count(*) > 1) d"""))
        tap.is_(twice, 0, "0 events applied twice")
        tap.is_(int(sql("SELECT count(*) FROM shipments")), orders - poison,
                "every valid order shipped once")
        tap.is_(int(sql("""SELECT count(*) FROM shipments s WHERE NOT EXISTS (
                             SELECT FROM outbox o JOIN orders r ON r.id = (o.payload->>'order_id')::bigint
                              WHERE o.message_id = s.message_id AND r.id = s.order_id
                                AND r.quantity = s.quantity)""")),
                0, "0 effects without a committed order (or with another order's data)")
        tap.is_(sql("SELECT (SELECT sum(reserved) FROM stock) = (SELECT sum(quantity) FROM orders)"),
                "t", "reserved stock equals the sum of the orders (no effect doubled or dropped)")
        tap.is_(int(sql("SELECT count(*) FROM idem_keys WHERE scope = 'consumer:shipping' "
                        "AND state = 'succeeded'")), orders - poison,
                "one applied dedup record per valid event")
        tap.is_(sql("""SELECT count(*) || ' ' || count(*) FILTER (WHERE k.retryable = false
                                    AND k.response->>'sqlstate' = '23514')
                         FROM idem_keys k WHERE k.scope = 'consumer:shipping' AND k.state = 'failed'"""),
                f"{poison} {poison}", "poison events recorded as failed (check_violation), not retried")
        tap.ok(poison > 0, "the run had poison events")
        dead = broker.queue_depth(topology.DEAD_LETTER_QUEUE)
        tap.ok(dead >= poison + 1, f"poison events and the unparseable message were dead-lettered "
               f"({dead} in {topology.DEAD_LETTER_QUEUE})")
        duplicates = sum(c["duplicates"] for c in consumed)
        tap.ok(duplicates > 0, f"duplicates were delivered and skipped ({duplicates})")
        tap.is_(sql("SELECT count(*) FROM outbox WHERE sent_at IS NULL"), "0",
                "every outbox row marked sent")

        # One batch of 40 with two bad messages, queued before a consumer starts: an id reused
        # for another event (IK001, named by the batch's error) and an effect the check constraint
        # refuses (found by halving). One message per transaction would take 41.
        reused = json.dumps(dict(json.loads(twice_payload), quantity=7))
        good = [(str(uuid.uuid4()), json.dumps({"order_id": 0, "sku": "sku-batch", "quantity": 1}))
                for _ in range(38)]
        bad_effect = (str(uuid.uuid4()), json.dumps({"order_id": 0, "sku": "sku-batch", "quantity": 0}))
        batch = good[:13] + [(twice_id, reused)] + good[13:29] + [bad_effect] + good[29:]
        dead_before = broker.queue_depth(topology.DEAD_LETTER_QUEUE)
        twice_key = f"""SELECT state, attempt, fingerprint, completed_at FROM idem_keys
                         WHERE scope = 'consumer:shipping' AND key = '{twice_id}'"""
        twice_before = sql(twice_key)
        applied_batch = lambda: int(sql("SELECT count(*) FROM shipments WHERE sku = 'sku-batch'"))
        publish(broker, [(message_id, payload.encode()) for message_id, payload in batch])
        consumer, consumer_out = procs.start("consumer", "--batch", str(len(batch)), "--linger", "1")
        tap.ok(wait_until(lambda: broker.queue_depth(topology.QUEUE) == 0 and broker.queue_depth(
            topology.DEAD_LETTER_QUEUE) == dead_before + 2 and applied_batch() == len(good), 120),
               "a batch with two bad messages: the rest applied, the two dead-lettered")
        consumer.terminate()
        consumer.wait(timeout=60)
        stats = last_json(consumer_out)
        note(f"consumer: {stats}")
        tap.is_((stats["applied"], stats["dead_lettered"]), (len(good), 2), "... counted by the consumer")
        tap.ok(stats["transactions"] <= 16, f"... in {stats['transactions']} transactions, not one "
               f"per message", json.dumps(stats))
        tap.is_(sql(twice_key) + " " + sql(f"""SELECT string_agg(quantity::text, ',') FROM shipments
                                                WHERE message_id = '{twice_id}'"""),
                twice_before + " 2", "the reused id's key and effect are still its first event's")
        tap.is_(sql(f"""SELECT state || ' ' || (response->>'sqlstate') FROM idem_keys
                         WHERE scope = 'consumer:shipping' AND key = '{bad_effect[0]}'"""),
                "failed 23514", "the refused effect is recorded as failed")
        note(f"total {time.monotonic() - started:.1f} s")
    except Exception as e:  # a harness failure is a failed test, never a silent pass
        tap.ok(False, f"the run completed ({type(e).__name__}: {e})")
    finally:
        if procs is not None:
            procs.stop_all()
        try:
            broker.stop()
        finally:        # a broker that fails to stop must not leave PostgreSQL running
            pg.stop()
        if tap.failed == 0:
            shutil.rmtree(base, ignore_errors=True)
        else:
            note(f"logs kept in {base}")
    print(f"1..{tap.passed + tap.failed}")
    print(f"{tap.passed} passed, {tap.failed} failed")
    return 0 if tap.failed == 0 and tap.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
