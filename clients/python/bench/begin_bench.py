"""Same-transaction mode per call: BEGIN with the claim in one exchange (pipeline mode) against
BEGIN and the claim apart (``begin_with_claim=False``), in one process, alternating blocks.

    begin_bench.py DSN [--blocks 30] [--calls 100] [--latency-ms 0]

Prints the median Python CPU and wall time per ``run_in_transaction`` call, for a replay and for
a new key (claim, INSERT, complete, COMMIT), and the median of the per-block ratios.
``--latency-ms`` holds every answer of the server that long (a proxy in this process, whose own
CPU then counts too): a network between the application and the database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent / "tests")]

import psycopg  # noqa: E402
from psycopg_pool import ConnectionPool  # noqa: E402

from loopback import ExchangeCounter  # noqa: E402
from pg_idempotency import Idempotency, Reply  # noqa: E402


class Delayed(ExchangeCounter):
    """Holds each chunk of the server's answers ``latency`` seconds before passing it on."""

    def __init__(self, dsn: str, latency: float) -> None:
        self.latency = latency
        super().__init__(dsn)

    def _pass(self, source: Any, sink: Any, pending: Any) -> None:
        if pending is None:
            return super()._pass(source, sink, pending)
        latency = self.latency

        class Late:
            def sendall(self, data: bytes) -> None:
                time.sleep(latency)
                sink.sendall(data)

            def shutdown(self, how: int) -> None:
                sink.shutdown(how)

        return super()._pass(source, Late(), pending)


def order(conn: Any) -> Reply:
    (order_id,) = conn.execute("INSERT INTO orders (total) VALUES (42) RETURNING id").fetchone()
    return Reply({"order_id": order_id}, 201)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=0)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY,"
                     " total integer NOT NULL)")
    proxy = Delayed(args.dsn, args.latency_ms / 1000) if args.latency_ms else None
    dsn = proxy.dsn if proxy else args.dsn
    variants = {"together": True, "apart": False}
    pools = {name: ConnectionPool(dsn, min_size=2, max_size=2, open=True) for name in variants}
    clients = {}
    for name, together in variants.items():
        pools[name].wait()
        clients[name] = Idempotency(pools[name], begin_with_claim=together)
    keys = {name: uuid.uuid4().hex for name in variants}
    for name, idem in clients.items():
        idem.run_in_transaction(keys[name], order, request={"total": 42}, read_row=False)
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for block in range(args.blocks):
        for workload in ("replay", "new"):
            order_of_variants = list(variants) if block % 2 == 0 else list(reversed(variants))
            for name in order_of_variants:  # alternating who goes first
                idem = clients[name]
                cpu, wall = time.process_time(), time.monotonic()
                for _ in range(args.calls):
                    key = keys[name] if workload == "replay" else uuid.uuid4().hex
                    idem.run_in_transaction(key, order, request={"total": 42}, read_row=False)
                times.setdefault((workload, name), []).append(
                    ((time.process_time() - cpu) / args.calls * 1e6,
                     (time.monotonic() - wall) / args.calls * 1e6))
    for pool in pools.values():
        pool.close()
    if proxy:
        proxy.close()
    print(f"{args.blocks} blocks of {args.calls} calls, {args.latency_ms:g} ms added per answer;"
          " medians, per call:")
    for workload in ("replay", "new"):
        together, apart = times[workload, "together"], times[workload, "apart"]
        for i, what in ((0, "CPU"), (1, "wall")):
            ratio = statistics.median(t[i] / a[i] for t, a in zip(together, apart))
            print(f"  {workload:6} {what:4}  apart {statistics.median(a[i] for a in apart):6.0f} us"
                  f"  together {statistics.median(t[i] for t in together):6.0f} us"
                  f"  together / apart {ratio:4.2f}")


if __name__ == "__main__":
    main()
