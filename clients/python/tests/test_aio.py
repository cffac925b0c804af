"""The asyncio client against the real extension."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any, AsyncIterator, Awaitable, Callable

import psycopg
import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from pg_idempotency import (AsyncIdempotency, Executed, InProgress, Lease, Outcome, Replayed,
                            Reply, State, errors)

AConn = psycopg.AsyncConnection[Any]


@pytest_asyncio.fixture
async def idem(dsn: str) -> AsyncIterator[AsyncIdempotency]:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=8, open=False) as pool:
        yield AsyncIdempotency(pool)


@pytest_asyncio.fixture
async def aconn(dsn: str) -> AsyncIterator[AConn]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        yield c


async def wait_until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Poll until the condition holds; the limit only ends a hang (a slow machine is fine)."""
    deadline = time.monotonic() + 60
    while not await condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


async def lease_ended(aconn: AConn, key: str) -> bool:
    cur = await aconn.execute("SELECT locked_until < clock_timestamp() FROM idem_keys"
                              " WHERE scope = '' AND key = %s", (key,))
    return await cur.fetchone() == (True,)


async def lease_outlived(aconn: AConn, key: str, claimed_until: datetime) -> bool:
    """On the server's clock: the lease as claimed has ended, and the key's lease still has
    more than a second to run (the heartbeat extended it)."""
    cur = await aconn.execute("SELECT clock_timestamp() > %s"
                              " AND locked_until > clock_timestamp() + interval '1 s'"
                              " FROM idem_keys WHERE scope = '' AND key = %s",
                              (claimed_until, key))
    return await cur.fetchone() == (True,)


@pytest.mark.asyncio
async def test_claim_complete_replay(idem: AsyncIdempotency, aconn: AConn, key: str) -> None:
    claimed = await idem.claim(aconn, key, request={"n": 1})
    assert (claimed.outcome, claimed.inserted, claimed.attempt) == (Outcome.CLAIMED, True, 1)
    await idem.complete(aconn, key, {"ok": 1}, response_code=201, attempt=1)
    replay = await idem.claim(aconn, key, request={"n": 1})
    assert (replay.outcome, replay.response, replay.state) == (
        Outcome.REPLAY, {"ok": 1}, State.SUCCEEDED)
    with pytest.raises(errors.KeyMismatchError):
        await idem.claim(aconn, key, request={"n": 2})


@pytest.mark.asyncio
async def test_same_transaction_commits_or_vanishes(idem: AsyncIdempotency, aconn: AConn,
                                                    key: str) -> None:
    async def failing(c: AConn) -> Reply:
        await c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('a', 1, %s)",
                        (key,))
        raise RuntimeError("boom")

    async def working(c: AConn) -> Reply:
        cur = await c.execute("INSERT INTO orders (customer, total, idem_key)"
                              " VALUES ('a', 1, %s) RETURNING id", (key,))
        row = await cur.fetchone()
        assert row is not None
        return Reply({"id": row[0]}, 201)

    with pytest.raises(RuntimeError):
        await idem.run_in_transaction(key, failing)
    assert await idem.lookup(aconn, key) is None
    first = await idem.run_in_transaction(key, working)
    second = await idem.run_in_transaction(key, working)
    assert isinstance(first, Executed) and isinstance(second, Replayed)
    assert second.response == first.reply.response
    cur = await aconn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,))
    assert await cur.fetchone() == (1,)


@pytest.mark.asyncio
async def test_retryable_reply_rolls_back_in_same_transaction_mode(
        idem: AsyncIdempotency, aconn: AConn, key: str) -> None:
    async def unavailable(c: AConn) -> Reply:
        await c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('a', 1, %s)",
                        (key,))
        return Reply.failure({"error": "try later"}, 503)

    result = await idem.run_in_transaction(key, unavailable)
    assert isinstance(result, Executed) and result.row is None
    assert await idem.lookup(aconn, key) is None
    cur = await aconn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,))
    assert await cur.fetchone() == (0,)


@pytest.mark.asyncio
async def test_lease_duplicates_and_stale_completion(idem: AsyncIdempotency, aconn: AConn,
                                                     key: str) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def stale(lease: Lease) -> Reply:
        started.set()
        await release.wait()
        return Reply({"from": "stale"})

    first = asyncio.create_task(idem.run_with_lease(key, stale, heartbeat=False,
                                                    lease=timedelta(seconds=60)))
    await started.wait()
    busy = await idem.run_with_lease(key, stale)
    assert isinstance(busy, InProgress) and 0 < busy.retry_after_s <= 60
    # the first worker's lease runs out: its end is moved to now (a minute is not waited out),
    # and the server's clock passes it
    await aconn.execute("UPDATE idem_keys SET locked_until = clock_timestamp()"
                        " WHERE scope = '' AND key = %s", (key,))
    await wait_until(lambda: lease_ended(aconn, key))

    async def fresh(lease: Lease) -> Reply:
        return Reply({"from": "fresh"})

    taken = await idem.run_with_lease(key, fresh)
    assert isinstance(taken, Executed) and taken.row is not None and taken.row.attempt == 2
    release.set()
    with pytest.raises(errors.StaleAttemptError):
        await first
    row = await idem.lookup(aconn, key)
    assert row is not None and row.response == {"from": "fresh"}


@pytest.mark.asyncio
async def test_lease_refuses_open_transaction(idem: AsyncIdempotency, dsn: str,
                                              key: str) -> None:
    async def work(lease: Lease) -> Reply:
        return Reply()

    async with await psycopg.AsyncConnection.connect(dsn) as c:
        await c.execute("SELECT 1")
        with pytest.raises(errors.OpenTransactionError):
            await idem.run_with_lease(key, work, conn=c)


@pytest.mark.asyncio
@pytest.mark.versions("1.2")
async def test_heartbeat_keeps_the_lease(idem: AsyncIdempotency, aconn: AConn,
                                         key: str) -> None:
    async def noop(lease: Lease) -> Reply:
        return Reply()

    async def long_job(lease: Lease) -> Reply:
        claimed = await idem.lookup(aconn, key)
        assert claimed is not None and claimed.locked_until is not None
        claimed_until = claimed.locked_until
        # the job runs past the lease it claimed; the server's clock says when that is, and
        # that the heartbeat has moved the lease on (every 1 s: it ends 2 to 3 s ahead)
        await wait_until(lambda: lease_outlived(aconn, key, claimed_until))
        assert isinstance(await idem.run_with_lease(key, noop), InProgress)
        return Reply({"attempt": lease.attempt})

    result = await idem.run_with_lease(key, long_job, lease=timedelta(seconds=3),
                                       heartbeat=True)
    assert isinstance(result, Executed) and result.row is not None
    assert result.row.attempt == 1


@pytest.mark.asyncio
@pytest.mark.versions("1.1")
async def test_heartbeat_needs_1_2(idem: AsyncIdempotency, key: str) -> None:
    async def noop(lease: Lease) -> Reply:
        return Reply()

    with pytest.raises(errors.UnsupportedVersionError, match="version 1.2"):
        await idem.run_with_lease(key, noop, lease=timedelta(seconds=1), heartbeat=True)
