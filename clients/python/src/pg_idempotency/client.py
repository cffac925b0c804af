# Generated from aio.py by tools/generate_sync.py: do not edit. Change aio.py, then run
# tools/generate_sync.py (tests/test_generated.py fails while this file differs from its output).
"""The client over a psycopg 3 ``ConnectionPool``."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Optional

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from . import _protocol as proto
from . import _wire
from . import errors
from ._concurrency import Event, join, spawn, wait_event
from .lease import Lease
from .results import (ClaimResult, Executed, InProgress, KeyRow, Outcome, Replayed, Reply,
                      RunResult)

Connection = psycopg.Connection[Any]
ExceptionPolicy = Callable[[Exception], Optional[Reply]]

logger = logging.getLogger(__name__)
#: libpq 14 or later: several statements before one Sync
_PIPELINE = psycopg.Pipeline.is_supported()
_COMMIT = _wire.Statement(_wire.COMMIT)
_SAVEPOINT = _wire.Statement(_wire.SAVEPOINT)
_ROLLBACK_TO_SAVEPOINT = _wire.Statement(_wire.ROLLBACK_TO_SAVEPOINT)


@contextmanager
def _autocommit(conn: Connection) -> Iterator[None]:
    """Autocommit on an idle connection (reading the extension's version): one round trip, no
    transaction left open. Afterwards the connection is as it was, or closed (so the pool
    discards it) if it was left broken."""
    if conn.autocommit:
        yield
        return
    conn.autocommit = True
    try:
        yield
    finally:
        if conn.info.transaction_status == TransactionStatus.IDLE:
            conn.autocommit = False
        else:
            conn.close()


def _result_statement(conn: Connection, ext: proto.Extension, key: str, reply: Reply, *,
                      scope: str, attempt: int, read_row: bool) -> _wire.Statement:
    """The statement storing the handler's result in the transaction that holds the key, which
    the handler must have left open."""
    if conn.info.transaction_status == TransactionStatus.IDLE:
        raise errors.UsageError(
            "the handler ended the transaction that holds the key (commit or rollback);"
            " the runner commits it, with the handler's result")
    return _wire.bind(conn, proto.finish(ext, key, reply, scope=scope, attempt=attempt,
                                         read_row=read_row))


def _check_no_transaction(conn: Connection) -> None:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise errors.OpenTransactionError(
            "lease mode must not run inside an open transaction: the claim would hold the key's "
            "row lock until that transaction ends, and duplicates would wait instead of getting "
            "in_progress; commit or roll back first, or use run_in_transaction"
        )


class Idempotency:
    """Idempotency keys over a psycopg 3 ``ConnectionPool`` that the application owns.

    The low-level methods (claim, complete, fail, lookup, extend, release, forget) run on a
    connection you pass, in whatever transaction it has. The runners take connections from the
    pool: ``run_in_transaction`` (same-transaction mode) and ``run_with_lease`` (lease mode).
    """

    def __init__(self, pool: ConnectionPool, *, lease: Optional[timedelta] = None,
                 ttl: Optional[timedelta] = None, transaction_retries: int = 3,
                 begin_with_claim: bool = True) -> None:
        self.pool = pool
        self.lease = lease
        self.ttl = ttl
        #: how many times a transaction that failed with 40001 or 40P01 is run again
        self.transaction_retries = transaction_retries
        #: same-transaction mode sends BEGIN and the claim in one exchange; False sends them
        #: apart: one round trip more (see the README)
        self.begin_with_claim = begin_with_claim
        self._extension: Optional[proto.Extension] = None

    # ---- the extension's functions -------------------------------------------------------

    def extension(self, conn: Optional[Connection] = None) -> proto.Extension:
        """The installed version and schema, read once per client."""
        if self._extension is None:
            # on the caller's connection when there is one (a pool of one connection has no
            # other to lend), in autocommit if idle so that no transaction is left open on it
            if conn is None:
                with self.pool.connection() as own, _autocommit(own):
                    row = own.execute(proto.EXTENSION_QUERY).fetchone()
            elif conn.info.transaction_status == TransactionStatus.IDLE:
                with _autocommit(conn):
                    row = conn.execute(proto.EXTENSION_QUERY).fetchone()
            else:
                row = conn.execute(proto.EXTENSION_QUERY).fetchone()
            self._extension = proto.Extension.from_row(row)
        return self._extension

    def _run(self, conn: Connection, call: proto.Call) -> Optional[tuple[Any, ...]]:
        try:
            with conn.cursor() as cur:
                cur.execute(call.query, call.params, binary=True)
                return cur.fetchone()
        except psycopg.Error as e:
            raise proto.typed(e) from e

    def claim(self, conn: Connection, key: str, *, request: Any = None,
              scope: str = "", ttl: Optional[timedelta] = None,
              lease: Optional[timedelta] = None, fingerprint: Optional[bytes] = None,
              wait: Optional[timedelta] = None) -> ClaimResult:
        call = proto.claim(self.extension(conn), key, request=request, scope=scope,
                           ttl=ttl or self.ttl, lease=lease or self.lease,
                           fingerprint=fingerprint, wait=wait)
        row = self._run(conn, call)
        assert row is not None
        return proto.parse_claim(row)

    def complete(self, conn: Connection, key: str, response: Any = None, *,
                 response_code: int = 200, scope: str = "",
                 attempt: Optional[int] = None, ttl: Optional[timedelta] = None,
                 body: Optional[bytes] = None,
                 headers: Optional[Mapping[str, Any]] = None) -> KeyRow:
        call = proto.complete(self.extension(conn), key, response,
                              response_code=response_code, scope=scope, attempt=attempt,
                              ttl=ttl, body=body, headers=headers)
        return self._key_row(conn, call)

    def fail(self, conn: Connection, key: str, response: Any = None, *,
             response_code: int = 500, retryable: bool = True, scope: str = "",
             attempt: Optional[int] = None, ttl: Optional[timedelta] = None,
             body: Optional[bytes] = None,
             headers: Optional[Mapping[str, Any]] = None) -> KeyRow:
        call = proto.fail(self.extension(conn), key, response, response_code=response_code,
                          retryable=retryable, scope=scope, attempt=attempt, ttl=ttl,
                          body=body, headers=headers)
        return self._key_row(conn, call)

    def lookup(self, conn: Connection, key: str, *,
               scope: str = "") -> Optional[KeyRow]:
        """The committed key, or None (a missing key, and from 1.2 an expired one)."""
        call = proto.lookup(self.extension(conn), key, scope=scope)
        return proto.parse_key_row(self._run(conn, call))

    def extend(self, conn: Connection, key: str, attempt: int, lease: timedelta, *,
               scope: str = "") -> KeyRow:
        """Heartbeat (1.2): the lease of this attempt ends ``lease`` from now."""
        call = proto.extend(self.extension(conn), key, attempt, lease, scope=scope)
        return self._key_row(conn, call)

    def release(self, conn: Connection, key: str, attempt: int, *,
                scope: str = "") -> KeyRow:
        """Give the key up without a result (1.2): the next claim takes it over at once."""
        call = proto.release(self.extension(conn), key, attempt, scope=scope)
        return self._key_row(conn, call)

    def forget(self, conn: Connection, key: str, *, scope: str = "",
               force: bool = False) -> bool:
        """Delete the key whatever its state (1.2); a live lease needs ``force``."""
        call = proto.forget(self.extension(conn), key, scope=scope, force=force)
        row = self._run(conn, call)
        assert row is not None
        return bool(row[0])

    def _key_row(self, conn: Connection, call: proto.Call) -> KeyRow:
        row = proto.parse_key_row(self._run(conn, call))
        assert row is not None
        return row

    # ---- same-transaction mode -----------------------------------------------------------

    def run_in_transaction(
            self, key: str, handler: Callable[[Connection], Reply], *,
            request: Any = None, scope: str = "", ttl: Optional[timedelta] = None,
            fingerprint: Optional[bytes] = None, wait: Optional[timedelta] = None,
            on_exception: Optional[ExceptionPolicy] = None, keep_writes_on_error: bool = False,
            on_claim: Optional[Callable[[ClaimResult], None]] = None,
            read_row: bool = True) -> RunResult:
        """Claim, run ``handler(conn)`` and store its reply in one transaction.

        The handler runs after a savepoint taken with the claim. A success commits its writes
        with the key. A terminal failure rolls its writes back to the savepoint and commits the
        failure alone (an error answer never leaves half the work committed), unless
        ``keep_writes_on_error``. A handler that raises, or replies with a retryable failure,
        rolls everything back (the key vanishes: the retry runs afresh). ``on_exception`` may
        turn an exception into a Reply, which is then stored (or, if it is retryable, rolled
        back) without the handler's writes. ``on_claim`` is called with the claim before the
        handler runs (the attempt, for the handler's context).
        A transaction that fails with 40001 or 40P01 is run again, at most
        ``transaction_retries`` times. ``read_row=False``: the stored row is not read back
        (``Executed.row`` is None), for callers that do not use it.
        """
        for retry in range(self.transaction_retries + 1):
            try:
                with self.pool.connection() as conn:
                    return self._in_transaction(
                        conn, key, handler, request=request, scope=scope, ttl=ttl,
                        fingerprint=fingerprint, wait=wait, on_exception=on_exception,
                        keep_writes_on_error=keep_writes_on_error, on_claim=on_claim,
                        read_row=read_row)
            except Exception as exc:
                if not proto.retries_transaction(exc) or retry == self.transaction_retries:
                    if isinstance(exc, psycopg.Error):
                        raise proto.typed(exc) from exc
                    raise
        raise AssertionError("unreachable")

    def _in_transaction(
            self, conn: Connection, key: str,
            handler: Callable[[Connection], Reply], *, request: Any, scope: str,
            ttl: Optional[timedelta], fingerprint: Optional[bytes], wait: Optional[timedelta],
            on_exception: Optional[ExceptionPolicy], keep_writes_on_error: bool,
            on_claim: Optional[Callable[[ClaimResult], None]], read_row: bool) -> RunResult:
        """One transaction on a pool connection (idle): BEGIN, the claim and the savepoint in
        one exchange, the handler, then the result with COMMIT in one exchange (see ``_wire``)."""
        ext = self.extension(conn)
        claim = _wire.bind(conn, proto.claim(ext, key, request=request, scope=scope,
                                             ttl=ttl or self.ttl, lease=self.lease,
                                             fingerprint=fingerprint, wait=wait))
        try:
            if self.begin_with_claim and _PIPELINE:
                answers = _wire.run(conn, [_wire.begin(conn), claim, _SAVEPOINT])
                answer = answers[1]
            elif _PIPELINE:
                _wire.run(conn, [_wire.begin(conn)])
                answer = _wire.run(conn, [claim, _SAVEPOINT])[0]
            else:
                _wire.run(conn, [_wire.begin(conn)])
                answer = _wire.run(conn, [claim])[0]
                _wire.run(conn, [_SAVEPOINT])
            claimed_row = _wire.row(conn, answer)
            assert claimed_row is not None
            claimed = proto.parse_claim(claimed_row)
            if claimed.outcome is not Outcome.CLAIMED:
                # a replay or a key in progress wrote nothing: COMMIT ends it as cheaply as
                # ROLLBACK, and psycopg 3.1 follows every ROLLBACK with DEALLOCATE ALL (another
                # round trip, and no statement stays prepared)
                conn.commit()
                return _not_claimed(claimed)
            if on_claim is not None:
                on_claim(claimed)
            reply, discard = self._reply(conn, handler, on_exception)
            if reply.failed and reply.retryable:
                _roll_back(conn)  # with the key: a retry runs afresh
                return Executed(reply, None)
            discard = discard or (reply.failed and not keep_writes_on_error)
            finish = _result_statement(conn, ext, key, reply, scope=scope,
                                       attempt=claimed.attempt, read_row=read_row)
            statements = [_ROLLBACK_TO_SAVEPOINT, finish] if discard else [finish]
            if _PIPELINE:
                answers = _wire.run(conn, [*statements, _COMMIT])
                answer = answers[len(statements) - 1]
            else:
                for statement in statements:
                    answer = _wire.run(conn, [statement])[0]
                _wire.run(conn, [_COMMIT])
            row = proto.parse_key_row(_wire.row(conn, answer)) if read_row else None
            return Executed(reply, row)
        except BaseException:
            _roll_back(conn)
            raise

    def _reply(self, conn: Connection,
               handler: Callable[[Connection], Reply],
               on_exception: Optional[ExceptionPolicy]) -> tuple[Reply, bool]:
        """The handler's reply, and whether its writes are to be discarded (a reply of the
        exception policy is stored without them)."""
        try:
            with _wire.transaction_held(conn):
                return handler(conn), False
        except Exception as exc:
            if on_exception is None or proto.retries_transaction(exc):
                raise
            policy_reply = on_exception(exc)
            if policy_reply is None:
                raise
            return policy_reply, True

    # ---- lease mode ----------------------------------------------------------------------

    def run_with_lease(
            self, key: str, handler: Callable[[Lease], Reply], *,
            request: Any = None, scope: str = "", ttl: Optional[timedelta] = None,
            lease: Optional[timedelta] = None, fingerprint: Optional[bytes] = None,
            wait: Optional[timedelta] = None, heartbeat: Optional[bool] = None,
            on_exception: Optional[ExceptionPolicy] = None,
            conn: Optional[Connection] = None, read_row: bool = True) -> RunResult:
        """Claim in autocommit, run ``handler(lease)`` with no transaction open, then store its
        reply fenced by the attempt.

        ``conn``: run the claim and the finish on this connection (it must have no open
        transaction) instead of pool connections. ``heartbeat`` extends the lease every third
        of its length while the handler runs (on a thread, or a task in asyncio, with pool
        connections): None (the default) whenever the extension can (1.2 and later), True
        requires it, False turns it off. A heartbeat that finds the key taken over sets
        ``lease.lost``; the reply is then not stored and that error (StaleAttemptError, or
        KeyNotFoundError when the key was forgotten) raises. A handler that raises stores a
        retryable failure (or what ``on_exception`` returns) and the exception propagates. A
        reply whose attempt was taken over meanwhile raises StaleAttemptError: never report it
        as success. ``read_row=False``: the stored row is not read back (``Executed.row`` is
        None).
        """
        lease = lease or self.lease
        ext = self.extension(conn)
        if heartbeat:
            ext.require("heartbeat (idem_extend)", proto.V1_2)
        beats = heartbeat if heartbeat is not None else ext.has_1_2
        if conn is not None:
            _check_no_transaction(conn)
        claimed_row = self._leased(conn, lambda ext: proto.claim(
            ext, key, request=request, scope=scope, ttl=ttl or self.ttl, lease=lease,
            fingerprint=fingerprint, wait=wait))
        assert claimed_row is not None
        claimed = proto.parse_claim(claimed_row)
        if claimed.outcome is not Outcome.CLAIMED:
            return _not_claimed(claimed)
        assert claimed.attempt is not None
        held = Lease(key, scope, claimed.attempt, claimed.inserted)
        beat = _Heartbeat(self, held, lease or ext.default_lease) if beats else None
        try:
            try:
                reply = handler(held)
            finally:
                if beat is not None:
                    beat.stop()
        except Exception as exc:
            policy_reply = on_exception(exc) if on_exception is not None else None
            if policy_reply is None:
                try:
                    if held.lost is None:
                        self._leased(conn, lambda ext: proto.finish(
                            ext, key, Reply.failure(), scope=scope, attempt=held.attempt,
                            read_row=False))
                except (errors.StaleAttemptError, errors.KeyNotFoundError,
                        errors.KeyNotPendingError):
                    pass  # no longer this attempt's key: nothing to record; the error raises
                raise
            reply = policy_reply
        if held.lost is not None:
            raise held.lost  # another attempt owns the key: this result is not stored
        row = self._leased(conn, lambda ext: proto.finish(
            ext, key, reply, scope=scope, attempt=held.attempt, read_row=read_row))
        return Executed(reply, proto.parse_key_row(row) if read_row else None)

    def _leased(self, conn: Optional[Connection],
                call: Callable[[proto.Extension], proto.Call]
                ) -> Optional[tuple[Any, ...]]:
        """One statement in autocommit (an implicit transaction of its own: no BEGIN is sent,
        and the connection's setting is not switched), on ``conn`` or on a pool connection,
        40001 retried; its first row. ``call`` builds the statement for the extension."""
        for retry in range(self.transaction_retries + 1):
            try:
                if conn is not None:
                    return self._autocommitted(conn, call)
                with self.pool.connection() as own:
                    return self._autocommitted(own, call)
            except errors.DatabaseError as exc:
                if not exc.retry_transaction or retry == self.transaction_retries:
                    raise
        raise AssertionError("unreachable")

    def _autocommitted(self, conn: Connection,
                       call: Callable[[proto.Extension], proto.Call]
                       ) -> Optional[tuple[Any, ...]]:
        _check_no_transaction(conn)
        statement = _wire.bind(conn, call(self.extension(conn)))
        try:
            return _wire.row(conn, _wire.run(conn, [statement])[0])
        except psycopg.Error as e:
            raise proto.typed(e) from e


class _Heartbeat:
    """Extends the lease every third of its length until stopped (on a task in asyncio, a thread
    in the sync client)."""

    def __init__(self, client: Idempotency, lease: Lease, length: timedelta) -> None:
        self._client = client
        self._lease = lease
        self._length = length
        self._stopped = Event()
        self._beating = spawn(self._beat)

    def stop(self) -> None:
        self._stopped.set()
        join(self._beating)

    def _beat(self) -> None:
        held = self._lease
        while not wait_event(self._stopped, self._length.total_seconds() / 3):
            try:
                self._client._leased(None, lambda ext: proto.extend(
                    ext, held.key, held.attempt, self._length, scope=held.scope))
            except (errors.StaleAttemptError, errors.KeyNotFoundError,
                    errors.KeyNotPendingError) as exc:
                held.lost = exc
                return
            except Exception as exc:  # the database is unreachable now: try at the next beat
                held.heartbeat_error = exc


def _roll_back(conn: Connection) -> None:
    """End the runner's transaction without its writes, if it is still open (a failing COMMIT
    has ended it; a broken connection is discarded by the pool). A rollback that fails does not
    hide the error that led to it."""
    if conn.closed:
        return
    if _wire.interrupted(conn):
        conn.close()  # an exchange was interrupted (cancelled) with answers unread
        return
    if conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        conn.rollback()  # psycopg's: it also resets its prepared-statement cache
    except Exception as exc:
        logger.warning("rollback of the idempotency runner's transaction failed: %s", exc)
        conn.close()


def _not_claimed(claimed: ClaimResult) -> RunResult:
    if claimed.outcome is Outcome.REPLAY:
        return Replayed(claimed)
    return InProgress(proto.retry_after_seconds(claimed.retry_after, claimed.retry_after_s),
                      claimed.attempt)
