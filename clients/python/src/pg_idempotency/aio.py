"""The asyncio client over a psycopg 3 ``AsyncConnectionPool``; the same API as ``client``."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from . import _protocol as proto
from . import _wire
from . import errors
from .client import (_COMMIT, _PIPELINE, _ROLLBACK_TO_SAVEPOINT, _SAVEPOINT, ExceptionPolicy,
                     _check_no_transaction, _not_claimed, _result_statement, logger)
from .lease import Lease
from .results import ClaimResult, Executed, KeyRow, Outcome, Reply, RunResult

AsyncConnection = psycopg.AsyncConnection[Any]


@asynccontextmanager
async def _autocommit(conn: AsyncConnection) -> AsyncIterator[None]:
    """See ``client._autocommit``."""
    if conn.autocommit:
        yield
        return
    await conn.set_autocommit(True)
    try:
        yield
    finally:
        if conn.info.transaction_status == TransactionStatus.IDLE:
            await conn.set_autocommit(False)
        else:
            await conn.close()


class AsyncIdempotency:
    """Idempotency keys over a psycopg 3 ``AsyncConnectionPool`` that the application owns.

    Every method mirrors ``Idempotency``'s, as a coroutine; handlers are coroutine functions.
    """

    def __init__(self, pool: AsyncConnectionPool, *, lease: Optional[timedelta] = None,
                 ttl: Optional[timedelta] = None, transaction_retries: int = 3,
                 begin_with_claim: bool = True) -> None:
        self.pool = pool
        self.lease = lease
        self.ttl = ttl
        self.transaction_retries = transaction_retries
        self.begin_with_claim = begin_with_claim
        self._extension: Optional[proto.Extension] = None

    # ---- the extension's functions -------------------------------------------------------

    async def extension(self, conn: Optional[AsyncConnection] = None) -> proto.Extension:
        if self._extension is None:
            # as the sync client: the caller's connection when there is one
            if conn is None:
                async with self.pool.connection() as own, _autocommit(own):
                    row = await (await own.execute(proto.EXTENSION_QUERY)).fetchone()
            elif conn.info.transaction_status == TransactionStatus.IDLE:
                async with _autocommit(conn):
                    row = await (await conn.execute(proto.EXTENSION_QUERY)).fetchone()
            else:
                row = await (await conn.execute(proto.EXTENSION_QUERY)).fetchone()
            self._extension = proto.Extension.from_row(row)
        return self._extension

    async def _run(self, conn: AsyncConnection, call: proto.Call) -> Optional[tuple[Any, ...]]:
        try:
            async with conn.cursor() as cur:
                await cur.execute(call.query, call.params, binary=True)
                return await cur.fetchone()
        except psycopg.Error as e:
            raise proto.typed(e) from e

    async def claim(self, conn: AsyncConnection, key: str, *, request: Any = None,
                    scope: str = "", ttl: Optional[timedelta] = None,
                    lease: Optional[timedelta] = None, fingerprint: Optional[bytes] = None,
                    wait: Optional[timedelta] = None) -> ClaimResult:
        call = proto.claim(await self.extension(conn), key, request=request, scope=scope,
                           ttl=ttl or self.ttl, lease=lease or self.lease,
                           fingerprint=fingerprint, wait=wait)
        row = await self._run(conn, call)
        assert row is not None
        return proto.parse_claim(row)

    async def complete(self, conn: AsyncConnection, key: str, response: Any = None, *,
                       response_code: int = 200, scope: str = "",
                       attempt: Optional[int] = None, ttl: Optional[timedelta] = None,
                       body: Optional[bytes] = None,
                       headers: Optional[Mapping[str, Any]] = None) -> KeyRow:
        call = proto.complete(await self.extension(conn), key, response,
                              response_code=response_code, scope=scope, attempt=attempt,
                              ttl=ttl, body=body, headers=headers)
        return await self._key_row(conn, call)

    async def fail(self, conn: AsyncConnection, key: str, response: Any = None, *,
                   response_code: int = 500, retryable: bool = True, scope: str = "",
                   attempt: Optional[int] = None, ttl: Optional[timedelta] = None,
                   body: Optional[bytes] = None,
                   headers: Optional[Mapping[str, Any]] = None) -> KeyRow:
        call = proto.fail(await self.extension(conn), key, response, response_code=response_code,
                          retryable=retryable, scope=scope, attempt=attempt, ttl=ttl,
                          body=body, headers=headers)
        return await self._key_row(conn, call)

    async def lookup(self, conn: AsyncConnection, key: str, *,
                     scope: str = "") -> Optional[KeyRow]:
        call = proto.lookup(await self.extension(conn), key, scope=scope)
        return proto.parse_key_row(await self._run(conn, call))

    async def extend(self, conn: AsyncConnection, key: str, attempt: int, lease: timedelta, *,
                     scope: str = "") -> KeyRow:
        call = proto.extend(await self.extension(conn), key, attempt, lease, scope=scope)
        return await self._key_row(conn, call)

    async def release(self, conn: AsyncConnection, key: str, attempt: int, *,
                      scope: str = "") -> KeyRow:
        call = proto.release(await self.extension(conn), key, attempt, scope=scope)
        return await self._key_row(conn, call)

    async def forget(self, conn: AsyncConnection, key: str, *, scope: str = "",
                     force: bool = False) -> bool:
        call = proto.forget(await self.extension(conn), key, scope=scope, force=force)
        row = await self._run(conn, call)
        assert row is not None
        return bool(row[0])

    async def _key_row(self, conn: AsyncConnection, call: proto.Call) -> KeyRow:
        row = proto.parse_key_row(await self._run(conn, call))
        assert row is not None
        return row

    async def _finish(self, conn: AsyncConnection, key: str, reply: Reply, *, scope: str,
                      attempt: Optional[int], read_row: bool) -> Optional[KeyRow]:
        call = proto.finish(await self.extension(conn), key, reply, scope=scope,
                            attempt=attempt, read_row=read_row)
        if not read_row:
            await self._run(conn, call)
            return None
        return await self._key_row(conn, call)

    # ---- same-transaction mode -----------------------------------------------------------

    async def run_in_transaction(
            self, key: str, handler: Callable[[AsyncConnection], Awaitable[Reply]], *,
            request: Any = None, scope: str = "", ttl: Optional[timedelta] = None,
            fingerprint: Optional[bytes] = None, wait: Optional[timedelta] = None,
            on_exception: Optional[ExceptionPolicy] = None, keep_writes_on_error: bool = False,
            on_claim: Optional[Callable[[ClaimResult], None]] = None,
            read_row: bool = True) -> RunResult:
        """See ``Idempotency.run_in_transaction``."""
        for retry in range(self.transaction_retries + 1):
            try:
                async with self.pool.connection() as conn:
                    return await self._in_transaction(
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

    async def _in_transaction(
            self, conn: AsyncConnection, key: str,
            handler: Callable[[AsyncConnection], Awaitable[Reply]], *, request: Any, scope: str,
            ttl: Optional[timedelta], fingerprint: Optional[bytes], wait: Optional[timedelta],
            on_exception: Optional[ExceptionPolicy], keep_writes_on_error: bool,
            on_claim: Optional[Callable[[ClaimResult], None]], read_row: bool) -> RunResult:
        """See ``Idempotency._in_transaction``."""
        ext = await self.extension(conn)
        claim = _wire.bind(conn, proto.claim(ext, key, request=request, scope=scope,
                                             ttl=ttl or self.ttl, lease=self.lease,
                                             fingerprint=fingerprint, wait=wait))
        try:
            if self.begin_with_claim and _PIPELINE:
                answer = (await _wire.run_async(conn, [_wire.begin(conn), claim,
                                                       _SAVEPOINT]))[1]
            elif _PIPELINE:
                await _wire.run_async(conn, [_wire.begin(conn)])
                answer = (await _wire.run_async(conn, [claim, _SAVEPOINT]))[0]
            else:
                await _wire.run_async(conn, [_wire.begin(conn)])
                answer = (await _wire.run_async(conn, [claim]))[0]
                await _wire.run_async(conn, [_SAVEPOINT])
            claimed_row = _wire.row(conn, answer)
            assert claimed_row is not None
            claimed = proto.parse_claim(claimed_row)
            if claimed.outcome is not Outcome.CLAIMED:
                await conn.commit()  # COMMIT, not ROLLBACK: see Idempotency
                return _not_claimed(claimed)
            if on_claim is not None:
                on_claim(claimed)
            reply, discard = await self._reply(conn, handler, on_exception)
            if reply.failed and reply.retryable:
                await _roll_back(conn)  # with the key: a retry runs afresh
                return Executed(reply, None)
            discard = discard or (reply.failed and not keep_writes_on_error)
            finish = _result_statement(conn, ext, key, reply, scope=scope,
                                       attempt=claimed.attempt, read_row=read_row)
            statements = [_ROLLBACK_TO_SAVEPOINT, finish] if discard else [finish]
            if _PIPELINE:
                answer = (await _wire.run_async(conn, [*statements, _COMMIT]))[
                    len(statements) - 1]
            else:
                for statement in statements:
                    answer = (await _wire.run_async(conn, [statement]))[0]
                await _wire.run_async(conn, [_COMMIT])
            row = proto.parse_key_row(_wire.row(conn, answer)) if read_row else None
            return Executed(reply, row)
        except BaseException:
            await _roll_back(conn)
            raise

    async def _reply(self, conn: AsyncConnection,
                     handler: Callable[[AsyncConnection], Awaitable[Reply]],
                     on_exception: Optional[ExceptionPolicy]) -> tuple[Reply, bool]:
        """See ``Idempotency._reply``."""
        try:
            with _wire.transaction_held(conn):
                return await handler(conn), False
        except Exception as exc:
            if on_exception is None or proto.retries_transaction(exc):
                raise
            policy_reply = on_exception(exc)
            if policy_reply is None:
                raise
            return policy_reply, True

    # ---- lease mode ----------------------------------------------------------------------

    async def run_with_lease(
            self, key: str, handler: Callable[[Lease], Awaitable[Reply]], *,
            request: Any = None, scope: str = "", ttl: Optional[timedelta] = None,
            lease: Optional[timedelta] = None, fingerprint: Optional[bytes] = None,
            wait: Optional[timedelta] = None, heartbeat: Optional[bool] = None,
            on_exception: Optional[ExceptionPolicy] = None,
            conn: Optional[AsyncConnection] = None, read_row: bool = True) -> RunResult:
        """See ``Idempotency.run_with_lease``; the heartbeat is a task."""
        lease = lease or self.lease
        ext = await self.extension(conn)
        if heartbeat:
            ext.require("heartbeat (idem_extend)", proto.V1_2)
        beats = heartbeat if heartbeat is not None else ext.has_1_2
        if conn is not None:
            _check_no_transaction(conn)
        claimed_row = await self._leased(conn, lambda ext: proto.claim(
            ext, key, request=request, scope=scope, ttl=ttl or self.ttl, lease=lease,
            fingerprint=fingerprint, wait=wait))
        assert claimed_row is not None
        claimed = proto.parse_claim(claimed_row)
        if claimed.outcome is not Outcome.CLAIMED:
            return _not_claimed(claimed)
        assert claimed.attempt is not None
        held = Lease(key, scope, claimed.attempt, claimed.inserted)
        beat = (asyncio.create_task(self._heartbeat(held, lease or ext.default_lease))
                if beats else None)
        try:
            try:
                reply = await handler(held)
            finally:
                if beat is not None:
                    beat.cancel()
                    await asyncio.gather(beat, return_exceptions=True)
        except Exception as exc:
            policy_reply = on_exception(exc) if on_exception is not None else None
            if policy_reply is None:
                try:
                    if held.lost is None:
                        await self._leased(conn, lambda ext: proto.finish(
                            ext, key, Reply.failure(), scope=scope, attempt=held.attempt,
                            read_row=False))
                except (errors.StaleAttemptError, errors.KeyNotFoundError,
                        errors.KeyNotPendingError):
                    pass  # no longer this attempt's key: nothing to record; the error raises
                raise
            reply = policy_reply
        if held.lost is not None:
            raise held.lost  # another attempt owns the key: this result is not stored
        row = await self._leased(conn, lambda ext: proto.finish(
            ext, key, reply, scope=scope, attempt=held.attempt, read_row=read_row))
        return Executed(reply, proto.parse_key_row(row) if read_row else None)

    async def _leased(self, conn: Optional[AsyncConnection],
                      call: Callable[[proto.Extension], proto.Call]
                      ) -> Optional[tuple[Any, ...]]:
        """See ``Idempotency._leased``; ``call`` builds the statement for the extension."""
        for retry in range(self.transaction_retries + 1):
            try:
                if conn is not None:
                    _check_no_transaction(conn)
                    return await self._autocommitted(conn, call)
                async with self.pool.connection() as own:
                    _check_no_transaction(own)
                    return await self._autocommitted(own, call)
            except errors.DatabaseError as exc:
                if not exc.retry_transaction or retry == self.transaction_retries:
                    raise
        raise AssertionError("unreachable")

    async def _autocommitted(self, conn: AsyncConnection,
                             call: Callable[[proto.Extension], proto.Call]
                             ) -> Optional[tuple[Any, ...]]:
        statement = _wire.bind(conn, call(await self.extension(conn)))
        try:
            return _wire.row(conn, (await _wire.run_async(conn, [statement]))[0])
        except psycopg.Error as e:
            raise proto.typed(e) from e

    async def _heartbeat(self, held: Lease, length: timedelta) -> None:
        """Extends the lease every third of its length until cancelled."""
        while True:
            await asyncio.sleep(length.total_seconds() / 3)
            try:
                await self._leased(None, lambda ext: proto.extend(
                    ext, held.key, held.attempt, length, scope=held.scope))
            except (errors.StaleAttemptError, errors.KeyNotFoundError,
                    errors.KeyNotPendingError) as exc:
                held.lost = exc
                return
            except Exception as exc:  # the database is unreachable now: try at the next beat
                held.heartbeat_error = exc


async def _roll_back(conn: AsyncConnection) -> None:
    """See ``client._roll_back``."""
    if conn.closed:
        return
    if _wire.interrupted(conn):
        await conn.close()  # an exchange was interrupted (cancelled) with answers unread
        return
    if conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        await conn.rollback()
    except Exception as exc:
        logger.warning("rollback of the idempotency runner's transaction failed: %s", exc)
        await conn.close()
