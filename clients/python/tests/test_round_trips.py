"""Round trips of same-transaction mode, counted on the wire (the server's ReadyForQuery
messages, through a proxy): BEGIN goes with the claim and the savepoint, and the result with
COMMIT (after ROLLBACK TO SAVEPOINT when the handler's writes are discarded), each group in one
exchange."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator

import psycopg
import pytest
import pytest_asyncio
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from loopback import ExchangeCounter
from pg_idempotency import (AsyncIdempotency, Executed, Idempotency, InProgress, Replayed, Reply,
                            State, errors)

Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]


@pytest.fixture
def wire(dsn: str) -> Iterator[ExchangeCounter]:
    with ExchangeCounter(dsn) as counter:
        yield counter


@pytest.fixture
def idem(wire: ExchangeCounter) -> Iterator[Idempotency]:
    # one connection, opened before anything is counted
    with ConnectionPool(wire.dsn, min_size=1, max_size=1, open=True) as pool:
        pool.wait()
        client = Idempotency(pool)
        client.extension()
        yield client


def insert_order(key: str, seen: list[int], wire: ExchangeCounter) -> Callable[[Conn], Reply]:
    def handler(c: Conn) -> Reply:
        seen.append(wire.ready)
        row = c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 42, %s)"
                        " RETURNING id", (key,)).fetchone()
        assert row is not None
        return Reply({"order_id": row[0]}, 201)
    return handler


def assert_clean(pool: ConnectionPool) -> None:
    """The pool's connection is idle, out of pipeline mode, as the application configured it."""
    with pool.connection() as c:
        assert c.info.transaction_status is pq.TransactionStatus.IDLE
        assert c.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert c.autocommit is False
        assert c.execute("SELECT 1").fetchone() == (1,)
        assert c.info.transaction_status is pq.TransactionStatus.INTRANS  # implicit BEGIN
        c.rollback()


def test_new_key_and_replay_exchanges(idem: Idempotency, wire: ExchangeCounter, conn: Conn,
                                      key: str) -> None:
    seen: list[int] = []
    before = wire.ready
    first = idem.run_in_transaction(key, insert_order(key, seen, wire), request={"total": 42},
                                    read_row=False)
    assert isinstance(first, Executed)
    # BEGIN + claim + SAVEPOINT before the handler; then INSERT, and complete + COMMIT
    assert seen == [before + 1]
    assert wire.ready - before == 3
    before = wire.ready
    replay = idem.run_in_transaction(key, insert_order(key, seen, wire), request={"total": 42})
    assert isinstance(replay, Replayed) and replay.response == first.reply.response
    # BEGIN + claim + SAVEPOINT, then the COMMIT that ends the replay's transaction
    assert wire.ready - before == 2
    assert len(seen) == 1
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (1,)
    assert_clean(idem.pool)


def test_a_stored_failure_discards_the_writes_in_the_result_exchange(
        idem: Idempotency, wire: ExchangeCounter, conn: Conn, key: str) -> None:
    """docs/http.md: a 4xx answer is stored without the handler's writes (rolled back to the
    savepoint taken with the claim), in the same number of exchanges as a success."""
    seen: list[int] = []

    def declines(c: Conn) -> Reply:
        insert_order(key, seen, wire)(c)
        return Reply.failure({"declined": True}, 409, retryable=False)

    before = wire.ready
    result = idem.run_in_transaction(key, declines, read_row=False)
    assert isinstance(result, Executed)
    # BEGIN + claim + SAVEPOINT; INSERT; ROLLBACK TO SAVEPOINT + fail + COMMIT
    assert seen == [before + 1] and wire.ready - before == 3
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)
    row = idem.lookup(conn, key)
    assert row is not None and row.state is State.FAILED and row.response_code == 409
    # keep_writes_on_error: the same exchanges, the order kept
    other = key + "-keep"
    before = wire.ready
    kept = idem.run_in_transaction(other, lambda c: declines(c), keep_writes_on_error=True)
    assert isinstance(kept, Executed) and wire.ready - before == 3
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (1,)
    assert_clean(idem.pool)


def test_an_exception_policy_reply_is_stored_without_the_writes(
        idem: Idempotency, wire: ExchangeCounter, conn: Conn, key: str) -> None:
    """A statement that failed in the handler leaves the transaction aborted; the rollback to
    the savepoint, in the result's exchange, lets the policy's reply be stored."""
    def fails(c: Conn) -> Reply:
        insert_order(key, [], wire)(c)
        c.execute("SELECT 1/0")
        return Reply({"never": True})

    before = wire.ready
    result = idem.run_in_transaction(
        key, fails, on_exception=lambda e: Reply.failure({"bad": True}, 400, retryable=False))
    assert isinstance(result, Executed) and result.row is not None
    assert result.row.state is State.FAILED
    # BEGIN + claim + SAVEPOINT; INSERT; the failing SELECT; ROLLBACK TO + fail + COMMIT
    assert wire.ready - before == 4
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)
    assert_clean(idem.pool)


def test_begin_apart_when_asked(wire: ExchangeCounter, key: str) -> None:
    with ConnectionPool(wire.dsn, min_size=1, max_size=1, open=True) as pool:
        pool.wait()
        idem = Idempotency(pool, begin_with_claim=False)
        idem.extension()
        seen: list[int] = []
        before = wire.ready
        idem.run_in_transaction(key, insert_order(key, seen, wire))
        # BEGIN, claim + SAVEPOINT, INSERT, complete + COMMIT
        assert seen == [before + 2] and wire.ready - before == 4
        before = wire.ready
        assert isinstance(idem.run_in_transaction(key, insert_order(key, seen, wire)), Replayed)
        assert wire.ready - before == 3
        assert_clean(pool)


def test_replays_stay_at_two_exchanges_once_statements_are_prepared(
        idem: Idempotency, wire: ExchangeCounter, key: str) -> None:
    idem.run_in_transaction(key, insert_order(key, [], wire))
    before = wire.ready
    for _ in range(12):  # psycopg prepares a statement at its 6th run
        assert isinstance(idem.run_in_transaction(key, insert_order(key, [], wire)), Replayed)
    assert wire.ready - before == 24
    assert_clean(idem.pool)


def test_a_failing_complete_rolls_back(idem: Idempotency, wire: ExchangeCounter, conn: Conn,
                                       key: str) -> None:
    """The result and COMMIT go in one exchange: when the result is refused, COMMIT is skipped
    and the runner rolls the transaction back, with the handler's writes and the key."""
    def finishes_it_first(c: Conn) -> Reply:
        insert_order(key, [], wire)(c)
        c.execute("SELECT FROM idem_complete(%s, '{\"by\": \"handler\"}')", (key,))
        return Reply({"by": "runner"})

    before = wire.ready
    with pytest.raises(errors.KeyNotPendingError):
        idem.run_in_transaction(key, finishes_it_first)
    # BEGIN + claim, INSERT, the handler's complete, complete + COMMIT (refused), ROLLBACK
    assert wire.ready - before == 5
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)
    assert idem.lookup(conn, key) is None
    assert_clean(idem.pool)


def test_a_handler_that_ends_the_transaction_is_refused(idem: Idempotency, wire: ExchangeCounter,
                                                        key: str) -> None:
    def commits(c: Conn) -> Reply:
        insert_order(key, [], wire)(c)
        c.execute("COMMIT")
        return Reply({"order": 1})

    # its result would otherwise be stored outside the transaction that holds the key
    with pytest.raises(errors.UsageError, match="ended the transaction"):
        idem.run_in_transaction(key, commits)
    assert_clean(idem.pool)


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_the_handler_cannot_end_the_transaction_through_psycopg(idem: Idempotency, conn: Conn,
                                                                key: str, end: str) -> None:
    def ends(c: Conn) -> Reply:
        c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 1, %s)", (key,))
        getattr(c, end)()  # refused, as inside conn.transaction(): nothing is committed
        return Reply({"order": 1})

    with pytest.raises(psycopg.ProgrammingError, match="forbidden within a Transaction"):
        idem.run_in_transaction(key, ends)
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,)).fetchone() == (0,)
    assert idem.lookup(conn, key) is None
    assert_clean(idem.pool)
    # the connection goes on as before: a handler's own savepoint still works
    def nested(c: Conn) -> Reply:
        with c.transaction():
            c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 1, %s)", (key,))
        return Reply({"order": 2})

    assert isinstance(idem.run_in_transaction(key, nested), Executed)
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,)).fetchone() == (1,)


@pytest.mark.asyncio
async def test_the_async_handler_cannot_commit(aidem: AsyncIdempotency, conn: Conn,
                                               key: str) -> None:
    async def commits(c: Any) -> Reply:
        await c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 1, %s)", (key,))
        await c.commit()
        return Reply({"order": 1})

    with pytest.raises(psycopg.ProgrammingError, match="forbidden within a Transaction"):
        await aidem.run_in_transaction(key, commits)
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,)).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM idem_keys WHERE key = %s", (key,)).fetchone() == (0,)


@pytest.mark.parametrize("case, error", [
    ("changed request", errors.KeyMismatchError),
    ("bad key", errors.InvalidArgumentError),
])
def test_errors_in_the_pipelined_claim_are_typed(idem: Idempotency, wire: ExchangeCounter,
                                                 conn: Conn, key: str, case: str,
                                                 error: type[errors.DatabaseError]) -> None:
    idem.run_in_transaction(key, lambda c: Reply({"ok": 1}), request={"n": 1})
    before = wire.ready
    with pytest.raises(error) as info:
        if case == "changed request":
            idem.run_in_transaction(key, lambda c: Reply({"ok": 2}), request={"n": 2})
        else:
            idem.run_in_transaction("bad\nkey", lambda c: Reply({"ok": 2}))
    assert info.value.http_status == (422 if case == "changed request" else 400)
    assert wire.ready - before == 2  # BEGIN + the failing claim, then ROLLBACK
    assert_clean(idem.pool)
    replay = idem.run_in_transaction(key, lambda c: Reply({"ok": 3}), request={"n": 1})
    assert isinstance(replay, Replayed) and replay.response == {"ok": 1}


def test_serialization_failure_in_the_pipelined_claim_is_retried(dsn: str, key: str) -> None:
    """At REPEATABLE READ, a claim that waited for another transaction's insert of its key
    fails with 40001; the retry, in a new transaction, finds the key finished: a replay."""
    with ExchangeCounter(dsn) as wire, ConnectionPool(
            wire.dsn, min_size=1, max_size=1, open=True, kwargs={
                "options": "-c default_transaction_isolation=repeatable\\ read"}) as pool, \
            psycopg.connect(dsn) as other:
        idem = Idempotency(pool, transaction_retries=1)
        idem.extension()
        other.execute("SELECT * FROM idem_claim(%s)", (key,))  # the key's row, uncommitted
        with pool.connection() as c:
            pid = c.info.backend_pid
        runs: list[int] = []
        results: list[Any] = []
        thread = threading.Thread(target=lambda: results.append(idem.run_in_transaction(
            key, lambda c: runs.append(1) or Reply({"mine": 1}))))
        thread.start()
        deadline = time.monotonic() + 30
        with psycopg.connect(dsn, autocommit=True) as watch:
            while watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone() != ("Lock",):
                assert time.monotonic() < deadline, "the claim never waited for the other insert"
                time.sleep(0.05)
        other.execute("SELECT FROM idem_complete(%s, '{\"theirs\": 1}')", (key,))
        other.commit()
        thread.join(30)
        assert runs == []
        assert len(results) == 1 and isinstance(results[0], Replayed)
        assert results[0].response == {"theirs": 1}
        assert_clean(pool)
        # with no retry left, the typed error (HTTP 503) reaches the caller
        idem.transaction_retries = 0
        other.execute("SELECT * FROM idem_claim(%s)", (key + "-2",))
        thread = threading.Thread(target=lambda: results.append(_capture(
            lambda: idem.run_in_transaction(key + "-2", lambda c: Reply({"mine": 1})))))
        thread.start()
        deadline = time.monotonic() + 30
        with psycopg.connect(dsn, autocommit=True) as watch:
            while watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone() != ("Lock",):
                assert time.monotonic() < deadline, "the claim never waited for the other insert"
                time.sleep(0.05)
        other.execute("SELECT FROM idem_complete(%s, '{}')", (key + "-2",))
        other.commit()
        thread.join(30)
        assert isinstance(results[1], errors.SerializationError)
        assert results[1].http_status == 503
        assert_clean(pool)


def _capture(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        return exc


def test_in_progress_ends_its_transaction(idem: Idempotency, wire: ExchangeCounter, conn: Conn,
                                          key: str) -> None:
    idem.claim(conn, key, lease=timedelta(seconds=30))  # a lease-mode worker holds the key
    before = wire.ready
    busy = idem.run_in_transaction(key, lambda c: Reply({}))
    assert isinstance(busy, InProgress) and 1 <= busy.retry_after_s <= 30
    assert wire.ready - before == 2
    assert_clean(idem.pool)


@pytest_asyncio.fixture
async def aidem(wire: ExchangeCounter) -> Any:
    async with AsyncConnectionPool(wire.dsn, min_size=1, max_size=1, open=False) as pool:
        await pool.wait()
        client = AsyncIdempotency(pool)
        await client.extension()
        yield client


@pytest.mark.asyncio
async def test_async_new_key_replay_and_error_exchanges(aidem: AsyncIdempotency,
                                                        wire: ExchangeCounter,
                                                        key: str) -> None:
    seen: list[int] = []

    async def handler(c: AConn) -> Reply:
        seen.append(wire.ready)
        await c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 1, %s)",
                        (key,))
        return Reply({"ok": 1}, 201)

    before = wire.ready
    first = await aidem.run_in_transaction(key, handler, request={"n": 1}, read_row=False)
    assert isinstance(first, Executed)
    assert seen == [before + 1] and wire.ready - before == 3
    before = wire.ready
    replay = await aidem.run_in_transaction(key, handler, request={"n": 1})
    assert isinstance(replay, Replayed) and replay.response == {"ok": 1}
    assert wire.ready - before == 2 and len(seen) == 1
    before = wire.ready
    with pytest.raises(errors.KeyMismatchError):
        await aidem.run_in_transaction(key, handler, request={"n": 2})
    assert wire.ready - before == 2

    async def declines(c: AConn) -> Reply:
        await handler(c)
        return Reply.failure({"declined": True}, 409, retryable=False)

    before = wire.ready
    declined = await aidem.run_in_transaction(key + "-409", declines)
    # BEGIN + claim + SAVEPOINT; INSERT; ROLLBACK TO SAVEPOINT + fail + COMMIT
    assert isinstance(declined, Executed) and wire.ready - before == 3
    assert declined.row is not None and declined.row.state is State.FAILED
    async with aidem.pool.connection() as c:
        assert c.info.transaction_status is pq.TransactionStatus.IDLE
        assert c.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert c.autocommit is False
        assert await (await c.execute("SELECT 1")).fetchone() == (1,)
        await c.rollback()


@pytest.mark.asyncio
async def test_async_failing_complete_rolls_back(aidem: AsyncIdempotency, wire: ExchangeCounter,
                                                 conn: Conn, key: str) -> None:
    async def finishes_it_first(c: AConn) -> Reply:
        await c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 1, %s)",
                        (key,))
        await c.execute("SELECT FROM idem_complete(%s, '{}')", (key,))
        return Reply({"by": "runner"})

    before = wire.ready
    with pytest.raises(errors.KeyNotPendingError):
        await aidem.run_in_transaction(key, finishes_it_first)
    # BEGIN + claim, INSERT, the handler's complete, complete + COMMIT (refused), ROLLBACK
    assert wire.ready - before == 5
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)
    async with aidem.pool.connection() as c:
        assert c.info.transaction_status is pq.TransactionStatus.IDLE
        assert c.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert await (await c.execute("SELECT count(*) FROM idem_keys WHERE key = %s",
                                      (key,))).fetchone() == (0,)
        await c.rollback()
