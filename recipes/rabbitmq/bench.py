#!/usr/bin/python3
"""Throughput of the recipe's relay and consumer against real servers (throwaway PostgreSQL and
RabbitMQ, as in the test). Prints a table; asserts nothing (docs/benchmarks.md keeps a run).

1. relay: N outbox rows written beforehand, drained by one relay (batches of 100): events per
   second, and the share of its time spent in PostgreSQL (fetch with SKIP LOCKED, mark, commit)
   versus publishing and waiting for confirms;
2. consumer: the N events waiting in the queue, drained by one consumer: with batches of 100 (all
   new), again after the relay published them all a second time (all duplicates), and with
   batches of 1 (all new, a transaction per message; for 30 s only).

    PG_CONFIG=... /usr/bin/python3 bench.py [N (default 20000)]"""

from __future__ import annotations

import os
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

import servers
import topology

HERE = Path(__file__).resolve().parent
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="idem-rabbitmq-bench-"))
    pg = servers.Postgres(base)
    broker = servers.RabbitMQ(base)
    rows = []
    running: list[subprocess.Popen[str]] = []
    try:
        pg.start()
        pg.psql("postgres", "CREATE DATABASE recipe")
        pg.psql("recipe", (HERE / "schema.sql").read_text())
        broker.start()
        os.environ.update(pg.env("recipe"), AMQP_URL=broker.url)
        sql = lambda q: pg.psql("recipe", q)
        sql(f"""WITH o AS (INSERT INTO orders (customer, sku, quantity)
                           SELECT 'c' || g % 97, 'sku-' || g % 10, 1 + g % 3
                             FROM generate_series(1, {N}) g RETURNING *)
                INSERT INTO outbox (routing_key, payload)
                SELECT 'order.created', jsonb_build_object('order_id', id, 'customer', customer,
                                                           'sku', sku, 'quantity', quantity)
                  FROM o""")
        sql("VACUUM ANALYZE")

        import relay as relay_module

        def relay_pass(label: str) -> None:
            relay = relay_module.Relay(batch=100, crash_after_publish=0)
            relay.connect()
            t0 = time.monotonic()
            while relay.publish_batch():
                pass
            elapsed = time.monotonic() - t0
            relay.disconnect()
            rows.append((label, N / elapsed,
                         f"{100 * relay.db_s / (relay.db_s + relay.broker_s):.0f} % in PostgreSQL, "
                         f"{100 * relay.broker_s / (relay.db_s + relay.broker_s):.0f} % publishing "
                         f"and awaiting confirms"))

        def consumer_pass(label: str, batch: int, limit_s: float | None = None) -> None:
            """Run one consumer until the queue is empty (or limit_s); events per second."""
            shipped_before = int(sql("SELECT count(*) FROM shipments"))
            t0 = time.monotonic()
            p = subprocess.Popen(["/usr/bin/python3", str(HERE / "consumer.py"), "--batch",
                                  str(batch)], env=dict(os.environ, PYTHONPATH=str(HERE)),
                                 stdout=subprocess.PIPE, text=True)
            running.append(p)
            while broker.queue_depth(topology.QUEUE) > 0:
                if limit_s is not None and time.monotonic() - t0 > limit_s:
                    break
                time.sleep(0.2)
            p.terminate()  # it finishes its batch and acks it first
            out, _ = p.communicate(timeout=60)
            elapsed = time.monotonic() - t0
            shipped = int(sql("SELECT count(*) FROM shipments")) - shipped_before
            handled = shipped if shipped else N - broker.queue_depth(topology.QUEUE)
            rows.append((label, handled / elapsed, f"{handled} events; {out.strip().splitlines()[-1]}"))

        relay_pass("relay, batches of 100")
        consumer_pass("consumer, batches of 100, new", 100)
        sql("UPDATE outbox SET sent_at = NULL")  # publish every event a second time
        relay_pass("relay again (same events)")
        consumer_pass("consumer, batches of 100, duplicates", 100)
        sql("TRUNCATE shipments; TRUNCATE stock; DELETE FROM idem_keys; "
            "UPDATE outbox SET sent_at = NULL")
        relay_pass("relay again")
        consumer_pass("consumer, batches of 1, new (first 30 s)", 1, limit_s=30)
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
                p.wait()
        broker.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(f"{N} events; events per second (from the start of the process to an empty queue for "
          f"the consumer)\n")
    print("| pass | events/s | notes |\n|---|---|---|")
    for label, rate, notes in rows:
        print(f"| {label} | {rate:.0f} | {notes} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
