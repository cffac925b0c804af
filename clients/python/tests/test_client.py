"""The synchronous client against the real extension."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, Callable

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pg_idempotency import (Executed, Idempotency, InProgress, Lease, Outcome, Replayed, Reply,
                            State, errors, http)

Conn = psycopg.Connection[Any]


@pytest.fixture
def idem(pool: ConnectionPool) -> Idempotency:
    return Idempotency(pool)


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll until the condition holds; the limit only ends a hang (a slow machine is fine)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def waits_for_a_lock(conn: Conn, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        (pid,)).fetchone() == (True,)


def lease_outlived(conn: Conn, key: str, claimed_until: datetime) -> bool:
    """On the server's clock: the lease as claimed has ended, and the key's lease still has
    more than a second to run (the heartbeat extended it)."""
    row = conn.execute("SELECT clock_timestamp() > %s"
                       " AND locked_until > clock_timestamp() + interval '1 s'"
                       " FROM idem_keys WHERE scope = '' AND key = %s",
                       (claimed_until, key)).fetchone()
    return row == (True,)


def test_the_edition_under_test_answers(idem: Idempotency, conn: Conn, ext_version: str,
                                        edition: str) -> None:
    """IDEMPOTENCY_EDITION names the edition that answers; the client reads its version."""
    assert idem.extension(conn).version == ext_version
    has_edition = conn.execute("SELECT to_regproc('idem_edition') IS NOT NULL").fetchone()
    if edition == "c" and ext_version == "1.1":
        assert has_edition == (False,)  # idem_edition() is new in 1.6
    else:
        assert conn.execute("SELECT idem_edition()").fetchone() == (edition,)


def test_a_decoy_version_table_moves_no_call(pool: ConnectionPool, conn: Conn, dsn: str,
                                             edition: str) -> None:
    """A table named idem_sql_version that anyone made elsewhere does not redirect the client's
    calls: the extension's schema wins over search_path, and the SQL edition's plain install is
    the one search_path finds."""
    decoy = "decoy_" + uuid.uuid4().hex[:12]
    conn.execute(f"CREATE SCHEMA {decoy}")
    conn.execute(f"CREATE TABLE {decoy}.idem_sql_version (version text NOT NULL)")
    conn.execute(f"INSERT INTO {decoy}.idem_sql_version VALUES ('9.9')")
    try:
        # the decoy first on search_path when the extension is installed; behind public (where
        # the plain install is) for the SQL edition
        path = f"{decoy},public" if edition == "c" else f"public,{decoy}"
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={path}") as app:
            found = Idempotency(pool).extension(app)
        assert found.schema == "public"
        assert found.version != "9.9"
    finally:
        conn.execute(f"DROP SCHEMA {decoy} CASCADE")


def test_claim_complete_replay_typed(idem: Idempotency, conn: Conn, key: str) -> None:
    first = idem.claim(conn, key, request={"a": 1}, scope="s")
    assert (first.outcome, first.inserted, first.attempt, first.state) == (
        Outcome.CLAIMED, True, 1, State.PENDING)
    row = idem.complete(conn, key, {"id": 7, "b": [1, 2]}, response_code=201, scope="s",
                        attempt=1)
    assert (row.state, row.attempt, row.response_code) == (State.SUCCEEDED, 1, 201)
    again = idem.claim(conn, key, request={"a": 1}, scope="s")
    assert again.outcome is Outcome.REPLAY
    assert (again.response, again.response_code, again.state) == (
        {"id": 7, "b": [1, 2]}, 201, State.SUCCEEDED)
    looked = idem.lookup(conn, key, scope="s")
    assert looked is not None and looked.state is State.SUCCEEDED
    assert idem.lookup(conn, key, scope="other") is None


def test_in_progress_gives_retry_after_seconds(idem: Idempotency, conn: Conn, key: str) -> None:
    idem.claim(conn, key, lease=timedelta(seconds=30))
    busy = idem.claim(conn, key)
    assert busy.outcome is Outcome.IN_PROGRESS
    assert busy.retry_after is not None and 29 < busy.retry_after.total_seconds() <= 30
    result = idem.run_with_lease(key, lambda lease: Reply({}))
    assert isinstance(result, InProgress) and 1 <= result.retry_after_s <= 30


@pytest.mark.parametrize("call, error", [
    (lambda i, c, k: (i.claim(c, k, request={"x": 1}), i.claim(c, k, request={"x": 2})),
     errors.KeyMismatchError),
    (lambda i, c, k: i.complete(c, k, {}), errors.KeyNotFoundError),
    (lambda i, c, k: (i.claim(c, k), i.complete(c, k, {}), i.complete(c, k, {})),
     errors.KeyNotPendingError),
    (lambda i, c, k: (i.claim(c, k), i.complete(c, k, {}, attempt=5)), errors.StaleAttemptError),
    (lambda i, c, k: i.claim(c, "bad\nkey"), errors.InvalidArgumentError),
    (lambda i, c, k: i.claim(c, k, lease=timedelta(seconds=-1)), errors.InvalidArgumentError),
    (lambda i, c, k: i.claim(c, k, fingerprint=b""), errors.InvalidArgumentError),
    (lambda i, c, k: i.claim(c, None), errors.NullArgumentError),  # type: ignore[arg-type]
])
def test_errors_are_typed(idem: Idempotency, conn: Conn, key: str, call: Any,
                          error: type[errors.DatabaseError]) -> None:
    with pytest.raises(error) as info:
        call(idem, conn, key)
    assert type(info.value) is error
    assert info.value.sqlstate_received == error.sqlstate
    assert isinstance(info.value.cause, psycopg.Error)
    answer = http.for_error(info.value)
    # over HTTP a key that vanished under its request is a stale attempt (docs/http.md)
    expected = 409 if error is errors.KeyNotFoundError else error.http_status
    assert answer is not None and answer.status == expected


@pytest.mark.parametrize("query, error", [
    ("SELECT '{'::jsonb", errors.InvalidJsonError),
    ("SELECT '\"\\u0000\"'::jsonb", errors.UntranslatableCharacterError),
])
def test_json_errors_are_typed(conn: Conn, query: str, error: type[errors.DatabaseError]) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query)
    assert type(errors.translate(info.value)) is error


def test_nul_in_json_is_refused_before_the_server(idem: Idempotency, conn: Conn,
                                                  key: str) -> None:
    for request in ({"s": "a\u0000b"}, {"a\u0000": 1}, [["\u0000"]]):
        with pytest.raises(errors.NulCharacterError):
            idem.claim(conn, key, request=request)
    assert idem.lookup(conn, key) is None
    idem.claim(conn, key)
    with pytest.raises(errors.NulCharacterError):
        idem.complete(conn, key, {"x": "\u0000"})


def test_read_only_transaction_is_typed(idem: Idempotency, dsn: str, key: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(errors.ReadOnlyError) as info:
            idem.claim(c, key)
        answer = http.for_error(info.value)
        assert answer is not None and answer.status == 503
        assert ("Retry-After", "1") in answer.headers


def test_lock_timeout_and_statement_timeout_are_typed(idem: Idempotency, dsn: str,
                                                      key: str) -> None:
    with psycopg.connect(dsn) as owner, psycopg.connect(dsn) as waiter:
        idem.claim(owner, key)  # uncommitted: a second claim waits for it
        waiter.execute("SET lock_timeout = '50ms'")
        with pytest.raises(errors.LockNotAvailableError):
            idem.claim(waiter, key)
        waiter.rollback()
        waiter.execute("SET statement_timeout = '50ms'")
        with pytest.raises(errors.QueryCanceledError):
            idem.claim(waiter, key)


def test_serialization_failure_is_typed(idem: Idempotency, dsn: str, key: str) -> None:
    with psycopg.connect(dsn) as reader, psycopg.connect(dsn, autocommit=True) as writer:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT 1")  # the snapshot is taken here
        idem.claim(writer, key)
        with pytest.raises(errors.SerializationError) as info:
            idem.claim(reader, key)
        assert info.value.retry_transaction


def test_deadlock_is_typed(idem: Idempotency, conn: Conn, dsn: str, key: str) -> None:
    a_done: list[BaseException] = []
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        idem.claim(a, key + "-1")
        idem.claim(b, key + "-2")

        def a_takes_second() -> None:
            try:
                idem.claim(a, key + "-2")
            except BaseException as e:  # one of the two is the deadlock victim
                a_done.append(e)

        t = threading.Thread(target=a_takes_second)
        t.start()
        wait_until(lambda: waits_for_a_lock(conn, a.info.backend_pid))
        b_error: list[BaseException] = []
        try:
            idem.claim(b, key + "-1")
        except BaseException as e:
            b_error.append(e)
            b.rollback()
        t.join(timeout=30)
        victims = [e for e in a_done + b_error if isinstance(e, errors.DeadlockError)]
        assert len(victims) == 1


def test_same_transaction_commits_business_row_and_key(idem: Idempotency, pool: ConnectionPool,
                                                       conn: Conn, key: str) -> None:
    def handler(c: Conn) -> Reply:
        row = c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('ada', 42, %s)"
                        " RETURNING id", (key,)).fetchone()
        assert row is not None
        return Reply({"order_id": row[0]}, 201)

    first = idem.run_in_transaction(key, handler, request={"total": 42}, scope="POST /orders")
    assert isinstance(first, Executed) and first.reply.code == 201
    second = idem.run_in_transaction(key, handler, request={"total": 42}, scope="POST /orders")
    assert isinstance(second, Replayed) and second.response == first.reply.response
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (1,)


def test_pool_of_one_connection(dsn: str, key: str) -> None:
    # the client's first call reads the extension's version on the connection it already holds:
    # a pool with no second connection to lend must not wait out its timeout
    with ConnectionPool(dsn, min_size=1, max_size=1, timeout=60, open=True) as one:
        one.wait()  # its one connection is ready: no request waits for the pool to fill
        one.pop_stats()
        idem = Idempotency(one)
        result = idem.run_in_transaction(key, lambda c: Reply({"ok": True}, 201))
        assert isinstance(result, Executed)
        # psycopg_pool counts the requests that found no connection free and had to wait
        assert one.get_stats().get("requests_queued", 0) == 0
        with one.connection() as c:
            assert c.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
            assert c.autocommit is False


def test_same_transaction_exception_rolls_back_both(idem: Idempotency, conn: Conn,
                                                    key: str) -> None:
    def handler(c: Conn) -> Reply:
        c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('x', 1, %s)", (key,))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        idem.run_in_transaction(key, handler)
    assert idem.lookup(conn, key) is None
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)


def test_same_transaction_terminal_policy_stores_failure_without_writes(
        idem: Idempotency, conn: Conn, key: str) -> None:
    def handler(c: Conn) -> Reply:
        c.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('x', 1, %s)", (key,))
        raise ValueError("declined")

    def policy(exc: Exception) -> Reply | None:
        return Reply.failure({"error": "declined"}, 402, retryable=False) \
            if isinstance(exc, ValueError) else None

    result = idem.run_in_transaction(key, handler, on_exception=policy)
    assert isinstance(result, Executed) and result.row.state is State.FAILED
    assert conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s",
                        (key,)).fetchone() == (0,)
    replay = idem.run_in_transaction(key, handler, on_exception=policy)
    assert isinstance(replay, Replayed) and replay.code == 402


def test_same_transaction_retries_serialization_failures(dsn: str, key: str) -> None:
    runs: list[int] = []
    behind = [key + "-x"]

    def handler(c: Conn) -> Reply:
        runs.append(1)
        if len(runs) == 1:  # another session creates a key behind this snapshot: 40001
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("SELECT * FROM idem_claim(%s)", (behind[0],))
        c.execute("SELECT * FROM idem_claim(%s)", (behind[0],))
        return Reply({"ok": True})

    with ConnectionPool(dsn, min_size=1, max_size=2, open=True, kwargs={
            "options": "-c default_transaction_isolation=repeatable\\ read"}) as rr_pool:
        result = Idempotency(rr_pool, transaction_retries=2).run_in_transaction(key, handler)
        assert isinstance(result, Executed)
        assert len(runs) == 2
        # retries are bounded: with none left, the typed error reaches the caller (HTTP 503)
        runs.clear()
        behind[0] = key + "-y"
        with pytest.raises(errors.SerializationError):
            Idempotency(rr_pool, transaction_retries=0).run_in_transaction(key + "-2", handler)
        assert len(runs) == 1


def test_lease_refuses_open_transaction(idem: Idempotency, dsn: str, key: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SELECT 1")  # psycopg opened a transaction
        with pytest.raises(errors.OpenTransactionError):
            idem.run_with_lease(key, lambda lease: Reply({}), conn=c)
    with psycopg.connect(dsn) as c, psycopg.connect(dsn, autocommit=True) as check:
        result = idem.run_with_lease(key, lambda lease: Reply({"ok": 1}), conn=c)
        assert isinstance(result, Executed)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert not c.autocommit
        assert idem.lookup(check, key) is not None


def test_lease_mode_duplicate_gets_in_progress_not_blocked(idem: Idempotency, key: str) -> None:
    started, release = threading.Event(), threading.Event()
    results: list[Any] = []

    def slow(lease: Lease) -> Reply:
        started.set()
        release.wait(10)
        return Reply({"n": 1})

    t = threading.Thread(target=lambda: results.append(
        idem.run_with_lease(key, slow, lease=timedelta(seconds=30))))
    t.start()
    assert started.wait(10)
    dup = idem.run_with_lease(key, slow, lease=timedelta(seconds=30))
    assert isinstance(dup, InProgress)
    release.set()
    t.join()
    assert isinstance(results[0], Executed)
    assert isinstance(idem.run_with_lease(key, slow), Replayed)


def test_lease_takeover_fences_stale_worker(idem: Idempotency, conn: Conn, key: str) -> None:
    started, release = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def stale(lease: Lease) -> Reply:
        started.set()
        release.wait(10)
        return Reply({"from": "stale"})

    def run_stale() -> None:
        try:
            outcome.append(idem.run_with_lease(key, stale, lease=timedelta(milliseconds=300),
                                               heartbeat=False))
        except Exception as e:
            outcome.append(e)

    t = threading.Thread(target=run_stale)
    t.start()
    assert started.wait(10)
    time.sleep(0.5)  # the lease ends
    fresh = idem.run_with_lease(key, lambda lease: Reply({"from": "fresh", "n": lease.attempt}))
    assert isinstance(fresh, Executed) and fresh.row.attempt == 2
    release.set()
    t.join()
    assert isinstance(outcome[0], errors.StaleAttemptError)
    row = idem.lookup(conn, key)
    assert row is not None and row.response == {"from": "fresh", "n": 2}


def test_lease_exception_stores_retryable_failure(idem: Idempotency, conn: Conn,
                                                  key: str) -> None:
    def boom(lease: Lease) -> Reply:
        raise RuntimeError("provider down")

    with pytest.raises(RuntimeError):
        idem.run_with_lease(key, boom)
    row = idem.lookup(conn, key)
    assert row is not None and (row.state, row.retryable) == (State.FAILED, True)
    again = idem.run_with_lease(key, lambda lease: Reply({"attempt": lease.attempt}))
    assert isinstance(again, Executed) and again.row.attempt == 2


def test_lease_exception_terminal_by_policy(idem: Idempotency, key: str) -> None:
    def declined(lease: Lease) -> Reply:
        raise ValueError("card declined")

    result = idem.run_with_lease(
        key, declined, on_exception=lambda e: Reply.failure({"error": "declined"}, 402,
                                                            retryable=False))
    assert isinstance(result, Executed) and result.row.retryable is False
    replay = idem.run_with_lease(key, declined)
    assert isinstance(replay, Replayed) and (replay.code, replay.state) == (402, State.FAILED)


@pytest.mark.versions("1.1")
def test_version_1_2_features_name_the_version(idem: Idempotency, conn: Conn, key: str) -> None:
    features = [
        lambda: idem.claim(conn, key, wait=timedelta(seconds=1)),
        lambda: idem.extend(conn, key, 1, timedelta(seconds=10)),
        lambda: idem.release(conn, key, 1),
        lambda: idem.forget(conn, key),
        lambda: idem.complete(conn, key, {}, body=b"x"),
        lambda: idem.fail(conn, key, {}, ttl=timedelta(minutes=5)),
        lambda: idem.run_with_lease(key, lambda lease: Reply(), lease=timedelta(seconds=3),
                                    heartbeat=True),
    ]
    for feature in features:
        with pytest.raises(errors.UnsupportedVersionError, match="version 1.2"):
            feature()
    assert idem.lookup(conn, key) is None  # refused before anything was sent


# ---- version 1.2 --------------------------------------------------------------------------

@pytest.mark.versions("1.2")
def test_extend_release_forget(idem: Idempotency, conn: Conn, key: str) -> None:
    claimed = idem.claim(conn, key, lease=timedelta(seconds=1))
    assert claimed.attempt == 1
    row = idem.extend(conn, key, 1, timedelta(minutes=5))
    assert row.locked_until is not None and row.locked_until > row.created_at + timedelta(
        minutes=4)
    with pytest.raises(errors.StaleAttemptError):
        idem.extend(conn, key, 2, timedelta(minutes=5))
    with pytest.raises(errors.KeyInProgressError):
        idem.forget(conn, key)
    idem.release(conn, key, 1)
    takeover = idem.claim(conn, key)
    assert (takeover.outcome, takeover.attempt) == (Outcome.CLAIMED, 2)
    assert idem.forget(conn, key, force=True) is True
    assert idem.lookup(conn, key) is None
    with pytest.raises(errors.KeyNotFoundError):
        idem.release(conn, key, 2)


@pytest.mark.versions("1.2")
def test_body_headers_ttl_and_retry_after_s(idem: Idempotency, conn: Conn, key: str) -> None:
    idem.claim(conn, key + "-busy", lease=timedelta(seconds=30))
    busy = idem.claim(conn, key + "-busy")
    assert busy.outcome is Outcome.IN_PROGRESS and busy.retry_after_s is not None
    assert 1 <= busy.retry_after_s <= 30
    idem.claim(conn, key)
    body = b"<xml>\x00\xff</xml>"
    row = idem.complete(conn, key, None, response_code=204, body=body,
                        headers={"Content-Type": "application/xml"}, ttl=timedelta(hours=1))
    assert row.completed_at is not None
    assert row.expires_at - row.completed_at == timedelta(hours=1)
    replay = idem.claim(conn, key)
    assert replay.outcome is Outcome.REPLAY and replay.response is None
    assert replay.response_body == body
    assert replay.response_headers == {"Content-Type": "application/xml"}


@pytest.mark.versions("1.2")
def test_heartbeat_keeps_the_lease(idem: Idempotency, conn: Conn, key: str) -> None:
    seen: list[Any] = []

    def long_job(lease: Lease) -> Reply:
        claimed = idem.lookup(conn, key)
        assert claimed is not None and claimed.locked_until is not None
        claimed_until = claimed.locked_until
        # the job runs past the lease it claimed; the server's clock says when that is, and
        # that the heartbeat has moved the lease on (every 1 s: it ends 2 to 3 s ahead)
        wait_until(lambda: lease_outlived(conn, key, claimed_until))
        seen.append(idem.run_with_lease(key, lambda held: Reply()))
        return Reply({"attempt": lease.attempt})

    result = idem.run_with_lease(key, long_job, lease=timedelta(seconds=3), heartbeat=True)
    assert isinstance(result, Executed) and result.row is not None
    assert result.row.attempt == 1
    assert [type(r) for r in seen] == [InProgress]


@pytest.mark.versions("1.2")
def test_heartbeat_reports_a_lost_lease(idem: Idempotency, conn: Conn, key: str) -> None:
    lost: list[Any] = []

    def long_job(lease: Lease) -> Reply:
        with idem.pool.connection() as other:  # an operator forgets the key meanwhile
            idem.forget(other, key, force=True)
        wait_until(lambda: lease.lost is not None)
        lost.append(lease.lost)
        return Reply({"lost": repr(lease.lost)})

    with pytest.raises(errors.KeyNotFoundError):
        idem.run_with_lease(key, long_job, lease=timedelta(milliseconds=600), heartbeat=True)
    # the heartbeat told the handler, before the runner tried to store its reply
    assert [type(e) for e in lost] == [errors.KeyNotFoundError]


@pytest.mark.parametrize("sqlstate, error, retry_after", [
    ("IK900", errors.ScopeMovedError, "1"),
    ("IK901", errors.PartitionUnavailableError, "5"),
])
def test_scale_out_errors_are_typed(conn: Conn, sqlstate: str, error: type[errors.DatabaseError],
                                    retry_after: str) -> None:
    # the scale-out proxy's functions raise these (scale-out/sql/proxy.sql)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'from the proxy' USING ERRCODE = '{sqlstate}';"
                     " END $$")
    typed = errors.translate(info.value)
    assert type(typed) is error
    answer = http.for_error(typed)
    assert answer is not None and answer.status == 503
    assert ("Retry-After", retry_after) in answer.headers


@pytest.mark.versions("1.3")
def test_batch_errors_name_the_key(idem: Idempotency, conn: Conn) -> None:
    ok, bad, fresh = (f"batch-{uuid.uuid4()}" for _ in range(3))
    conn.execute("SELECT count(*) FROM idem_claim_batch(%s, requests => %s::jsonb[])",
                 ([ok, bad], ['{"n": 1}', '{"n": 2}']))
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM idem_claim_batch(%s, requests => %s::jsonb[])",
                     ([fresh, ok, bad], ["{}", '{"n": 1}', '{"n": 3}']))
    mismatch = errors.translate(info.value)
    assert isinstance(mismatch, errors.KeyMismatchError) and mismatch.key == bad
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT idem_complete_batch(%s)", ([ok, fresh],))
    missing = errors.translate(info.value)
    assert isinstance(missing, errors.KeyNotFoundError) and missing.key == fresh
    # nothing of either failed call was written: the first key is still pending
    rows = conn.execute("SELECT key, state::text FROM idem_keys WHERE key = ANY(%s)",
                        ([ok, bad, fresh],)).fetchall()
    assert dict(rows) == {ok: "pending", bad: "pending"}
    # errors of single calls name the key in their message only
    with pytest.raises(errors.KeyMismatchError) as single:
        idem.claim(conn, bad, request={"n": 4})
    assert single.value.key is None


@pytest.mark.versions("1.5")
@pytest.mark.sql_edition_difference("no row-security record (idem_row_security, IK006)")
def test_row_security_not_in_force_is_typed(idem: Idempotency, conn: Conn, dsn: str,
                                            key: str) -> None:
    role = "py_tenant_" + uuid.uuid4().hex[:12]
    schema = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension"
                          " WHERE extname = 'idempotency'").fetchone()[0]  # type: ignore[index]
    conn.execute(f"CREATE ROLE {role}")
    conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    conn.execute(f"GRANT SELECT, INSERT, UPDATE ON {schema}.idem_keys TO {role}")
    # what a restore that could not apply the recorded policies leaves: the record says
    # row-level security is on, the table has none (written without applying it: no trigger
    # fires in replica mode, as in a data-only restore with --disable-triggers)
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f"INSERT INTO {schema}.idem_row_security (enabled, forced) VALUES (true, false)")
    try:
        with psycopg.connect(dsn, autocommit=True) as tenant:
            tenant.execute(f"SET ROLE {role}")
            with pytest.raises(errors.RowSecurityNotInForceError) as info:
                idem.claim(tenant, key)
        assert info.value.sqlstate_received == "IK006"
        answer = http.for_error(info.value)
        assert answer is not None and answer.status == 503
        assert ("Retry-After", "5") in answer.headers
    finally:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(f"DELETE FROM {schema}.idem_row_security")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
