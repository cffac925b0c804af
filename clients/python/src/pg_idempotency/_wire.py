"""The runners' exchanges with the server, written through libpq (psycopg's ``pgconn``).

Same-transaction mode sends ``BEGIN`` with the claim and a savepoint, and the result with
``COMMIT`` (after ``ROLLBACK TO SAVEPOINT`` when the handler's writes are discarded), each group in
one exchange (two statements before one Sync, libpq's pipeline mode); lease mode sends one
statement per exchange, in an implicit transaction (autocommit without switching the connection
to it). psycopg's cursor and pipeline machinery cost more Python CPU per statement than the
database work of these statements, so they are bypassed here, under the connection's lock, and
only here: psycopg reads the transaction status from libpq (it keeps no copy to go stale), the
statements are unnamed (psycopg's prepared-statement cache is not involved), and errors are
psycopg's own exceptions, built from the result as psycopg builds them. The handler's statements
go through psycopg as usual, in the transaction opened here.

Everything that depends on psycopg's internals is in this module (``psycopg.generators``, the
connection's ``lock``, ``wait`` and ``_num_transactions``, libpq's pipeline status), for the psycopg
versions pyproject.toml names.
"""

from __future__ import annotations

import struct
from datetime import timedelta
from contextlib import contextmanager
from typing import Any, Generator, Iterator, Optional, Sequence, Union

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.generators import execute, fetch_many, send
from psycopg.types.json import Jsonb

from ._protocol import Call

AnyConnection = Union["psycopg.Connection[Any]", "psycopg.AsyncConnection[Any]"]
Results = list[pq.abc.PGresult]
Exchange = Generator[Any, Any, Results]

_TEXT, _BINARY = 0, 1
_TEXT_OID, _BOOL_OID, _INT4_OID, _INT8_OID = 25, 16, 23, 20
_BYTEA_OID, _INTERVAL_OID, _JSONB_OID = 17, 1186, 3802
_INTERVAL = struct.Struct("!qii")  # microseconds, days, months: interval's binary form
_INT4_MIN, _INT4_MAX = -(2 ** 31), 2 ** 31 - 1
COMMIT = b"COMMIT"
#: taken right after the claim in same-transaction mode: a stored 4xx answer rolls the handler's
#: writes back to it (docs/http.md)
SAVEPOINT = b"SAVEPOINT idempotency_handler"
ROLLBACK_TO_SAVEPOINT = b"ROLLBACK TO SAVEPOINT idempotency_handler"


class Statement:
    """One statement with its parameters encoded for the extended protocol."""

    __slots__ = ("query", "values", "types", "formats")

    def __init__(self, query: bytes, values: Sequence[Optional[bytes]] = (),
                 types: Sequence[int] = (), formats: Sequence[int] = ()) -> None:
        self.query = query
        self.values = values
        self.types = types
        self.formats = formats


@contextmanager
def transaction_held(conn: AnyConnection) -> Iterator[None]:
    """While the handler runs, psycopg refuses ``conn.commit()`` and ``conn.rollback()`` with
    its own ProgrammingError, as inside ``conn.transaction()``: the transaction holds the key,
    and the runner opened it without psycopg's Transaction (which would add an exchange). psycopg
    counts its open Transaction blocks in ``_num_transactions`` (3.0 to 3.2) and checks it in
    commit() and rollback()."""
    conn._num_transactions += 1
    try:
        yield
    finally:
        conn._num_transactions -= 1


def interrupted(conn: AnyConnection) -> bool:
    """An exchange was cut short (cancelled) with answers unread: libpq is still in pipeline
    mode, and the connection's protocol state is unknown."""
    return conn.pgconn.pipeline_status != pq.PipelineStatus.OFF


def begin(conn: AnyConnection) -> Statement:
    """``BEGIN`` with the connection's isolation level, read only and deferrable settings, as
    psycopg would open the transaction."""
    parts = [b"BEGIN"]
    if conn.isolation_level is not None:
        parts.append(b"ISOLATION LEVEL "
                     + psycopg.IsolationLevel(conn.isolation_level).name.replace("_", " ").encode())
    if conn.read_only is not None:
        parts.append(b"READ ONLY" if conn.read_only else b"READ WRITE")
    if conn.deferrable is not None:
        parts.append(b"DEFERRABLE" if conn.deferrable else b"NOT DEFERRABLE")
    return Statement(b" ".join(parts))


def bind(conn: AnyConnection, call: Call) -> Statement:
    """The call's statement with its parameters encoded: each with its type, so that the
    server resolves the function as it would with psycopg's adaptation."""
    encoding = conn.info.encoding
    values: list[Optional[bytes]] = []
    types: list[int] = []
    formats: list[int] = []
    jsonb = None
    for value in call.params.values():
        # exact types first: the common cases cost one dict-free comparison each
        kind = type(value)
        if kind is str:
            values.append(value.encode(encoding))
            types.append(_TEXT_OID)
            formats.append(_TEXT)
        elif kind is Jsonb:
            if jsonb is None:  # the connection's JSON dumps (psycopg.types.json.set_json_dumps)
                jsonb = conn.adapters.get_dumper(Jsonb, PyFormat.TEXT)(Jsonb, conn)
            values.append(bytes(jsonb.dump(value)))
            types.append(_JSONB_OID)
            formats.append(_TEXT)
        elif kind is bool:
            values.append(b"t" if value else b"f")
            types.append(_BOOL_OID)
            formats.append(_TEXT)
        elif kind is int:
            values.append(str(value).encode())
            types.append(_INT4_OID if _INT4_MIN <= value <= _INT4_MAX else _INT8_OID)
            formats.append(_TEXT)
        elif kind is timedelta:
            values.append(_INTERVAL.pack(value.seconds * 1_000_000 + value.microseconds,
                                         value.days, 0))
            types.append(_INTERVAL_OID)
            formats.append(_BINARY)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            values.append(bytes(value))
            types.append(_BYTEA_OID)
            formats.append(_BINARY)
        elif value is None:
            values.append(None)
            types.append(0)
            formats.append(_TEXT)
        else:  # anything else (a str subclass, a Decimal): psycopg's adaptation
            dumper = Transformer(conn).get_dumper(value, PyFormat.TEXT)
            dumped = dumper.dump(value)
            values.append(None if dumped is None else bytes(dumped))
            types.append(dumper.oid)
            formats.append(_TEXT)
    return Statement(call.wire_query, values, types, formats)


def exchange(pgconn: pq.abc.PGconn, statements: Sequence[Statement]) -> Exchange:
    """Send the statements before one Sync and read one result per statement (a statement
    after a failing one is answered PIPELINE_ABORTED: the caller raises the first error).
    Binary rows. Run it with the connection's ``wait``, under its lock."""
    if len(statements) == 1:
        s = statements[0]
        pgconn.send_query_params(s.query, s.values, s.types, s.formats, _BINARY)
        results = yield from execute(pgconn)
        return results[-1:]
    pgconn.enter_pipeline_mode()
    try:
        for s in statements:
            pgconn.send_query_params(s.query, s.values, s.types, s.formats, _BINARY)
        pgconn.pipeline_sync()
        yield from send(pgconn)  # one write, normally
        answers: Results = []
        for _ in statements:
            answers.extend((yield from fetch_many(pgconn))[-1:])
        (yield from fetch_many(pgconn))  # the Sync's PIPELINE_SYNC
        pgconn.exit_pipeline_mode()
    except BaseException:
        # interrupted with answers unread: the connection's protocol state is unknown, so it is
        # closed (a pool then discards it) rather than handed back half-way through
        pgconn.finish()
        raise
    return answers


def run(conn: "psycopg.Connection[Any]", statements: Sequence[Statement]) -> Results:
    """One exchange on a sync connection; raises the first statement's error."""
    with conn.lock:
        return checked(conn, conn.wait(exchange(conn.pgconn, statements)))


async def run_async(conn: "psycopg.AsyncConnection[Any]",
                    statements: Sequence[Statement]) -> Results:
    async with conn.lock:
        return checked(conn, await conn.wait(exchange(conn.pgconn, statements)))


def checked(conn: AnyConnection, results: Results) -> Results:
    for result in results:  # the statements after a failing one are PIPELINE_ABORTED
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
    return results


def row(conn: AnyConnection, result: pq.abc.PGresult) -> Optional[tuple[Any, ...]]:
    """The first row of a result (binary format), loaded by psycopg's adapters; a loader is
    looked up only for the columns that are not NULL (most of a claim's are)."""
    if not result.ntuples:
        return None
    loaders = Transformer(conn)
    values: list[Any] = []
    for column in range(result.nfields):
        value = result.get_value(0, column)
        values.append(None if value is None else
                      loaders.get_loader(result.ftype(column), pq.Format.BINARY).load(value))
    return tuple(values)
