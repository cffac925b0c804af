"""What the sync and asyncio clients share: the SQL they send and how they read the answers.

The clients only do I/O around these; every rule about keys lives in the extension.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping, Optional, Sequence

import psycopg
from psycopg.types.json import Jsonb

from . import errors
from .results import ClaimResult, KeyRow, Outcome, Reply, State

# with the default lease, which heartbeats extend by when a route sets no lease of its own.
# The SQL edition installed as plain SQL (docs/editions.md) is no extension: its schema is the
# one of its version table idem_sql_version that search_path finds (as the application's own
# unqualified names are), and its version is that table's row, read in the same statement.
EXTENSION_QUERY = (
    "SELECT e.extversion, n.nspname,"
    " pg_catalog.current_setting('idempotency.default_lease', true)"
    " FROM pg_catalog.pg_extension e"
    " JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'idempotency'"
    " UNION ALL"
    " SELECT (pg_catalog.xpath('/row/version/text()', pg_catalog.query_to_xml(pg_catalog.format("
    "'SELECT version FROM %I.idem_sql_version', n.nspname), false, true, '')))[1]::text,"
    " n.nspname, pg_catalog.current_setting('idempotency.default_lease', true)"
    " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = pg_catalog.to_regclass('idem_sql_version')"
    " AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'idempotency')"
)

V1_2 = (1, 2)

# The columns read back, named rather than SELECT *: rows are read as tuples (cheaper than dicts
# in psycopg's Python implementation), and a later version's new columns change nothing here.
# Results come in binary format (timestamps, intervals and bytea cost less to load than their
# text), so the enums are read as text.
_CLAIM_COLUMNS = ("outcome::text", "inserted", "attempt", "state::text", "response",
                  "response_code", "retry_after", "expires_at")
_CLAIM_COLUMNS_1_2 = _CLAIM_COLUMNS + ("response_body", "response_headers", "retry_after_s")
_KEY_COLUMNS = ("scope", "key", "state::text", "attempt", "fingerprint", "response", "response_code",
                "retryable", "created_at", "locked_until", "completed_at", "expires_at")
_KEY_COLUMNS_1_2 = _KEY_COLUMNS + ("response_body", "response_headers")
#: what each function's statement reads back; functions not named here: every column
_RETURNING = {"idem_claim": "claim", "idem_complete": "key", "idem_fail": "key",
              "idem_lookup": "key", "idem_extend": "key", "idem_release": "key"}


@dataclass(frozen=True)
class Extension:
    """The installed extension: its version (what the client may call) and its schema."""

    version: str
    schema: str
    #: idempotency.default_lease as the client's session saw it when it read the version
    default_lease: timedelta = timedelta(minutes=1)
    #: statement texts already built (psycopg's and libpq's placeholders), by function, the
    #: arguments sent and whether a row is read
    queries: dict[tuple[str, tuple[str, ...], bool], tuple[str, bytes]] = field(
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_row(cls, row: Optional[tuple[Any, ...]]) -> "Extension":
        if row is None:
            raise errors.ExtensionMissingError(
                "the database has no idempotency extension (CREATE EXTENSION idempotency)"
            )
        return cls(str(row[0]), str(row[1]), _lease_setting(row[2] if len(row) > 2 else None))

    @functools.cached_property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.version.split("."))

    @functools.cached_property
    def has_1_2(self) -> bool:
        return self.version_tuple >= V1_2

    def columns(self, function: str) -> str:
        kind = _RETURNING.get(function)
        if kind is None:
            return "*"
        if kind == "claim":
            return ", ".join(_CLAIM_COLUMNS_1_2 if self.has_1_2 else _CLAIM_COLUMNS)
        return ", ".join(_KEY_COLUMNS_1_2 if self.has_1_2 else _KEY_COLUMNS)

    def require(self, feature: str, version: tuple[int, int]) -> None:
        if self.version_tuple < version:
            raise errors.UnsupportedVersionError(
                feature, ".".join(map(str, version)), self.version
            )

    def function(self, name: str) -> str:
        """The function's name qualified by the extension's schema (never search_path)."""
        return '"' + self.schema.replace('"', '""') + '".' + name


_UNITS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _lease_setting(text: Optional[str]) -> timedelta:
    """A milliseconds setting as current_setting shows it (``1min``, ``1500ms``; a bare number
    is milliseconds); NULL when the library is not loaded in that session: the default."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|h|d)?\s*", text or "")
    if match is None:
        return timedelta(minutes=1)
    return timedelta(milliseconds=int(match.group(1)) * _UNITS[match.group(2) or "ms"])


@dataclass(frozen=True)
class Call:
    """One statement and its parameters: ``query`` names them (``%(key)s``, for a psycopg
    cursor), ``wire_query`` numbers them in the order of ``params`` (``$1``, for libpq)."""

    query: str
    params: dict[str, Any]
    wire_query: bytes


def _call(ext: Extension, function: str, positional: list[str], named: dict[str, Any],
          params: dict[str, Any], read_row: bool = True) -> Call:
    """``SELECT <columns> FROM schema.function(%(key)s, name => %(name)s, ...)``; arguments
    left None are not sent, so the function's own defaults apply. ``read_row=False`` reads no
    column back (the caller does not use the row). The text is built once per function and set
    of arguments (the same text also lets psycopg prepare the statement)."""
    sent = tuple(name for name, value in named.items() if value is not None)
    for name in sent:
        params[name] = named[name]
    texts = ext.queries.get((function, sent, read_row))
    if texts is None:
        columns = ext.columns(function) if read_row else ""

        def text(placeholders: list[str]) -> str:
            args = placeholders[:len(positional)] + [
                f"{name} => {placeholder}"
                for name, placeholder in zip(sent, placeholders[len(positional):])]
            return f"SELECT {columns} FROM {ext.function(function)}({', '.join(args)})"

        names = list(positional) + list(sent)
        texts = (text([f"%({name})s" for name in names]),
                 text([f"${n}" for n in range(1, len(names) + 1)]).encode())
        ext.queries[function, sent, read_row] = texts
    return Call(texts[0], params, texts[1])


def has_nul(value: Any) -> bool:
    """Does a JSON value hold U+0000 in a string or an object key?"""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_nul(v) for v in value)
    return False


def _json(name: str, value: Any) -> Optional[Jsonb]:
    if value is None or isinstance(value, Jsonb):  # a Jsonb is passed through as it is
        return value
    if has_nul(value):
        raise errors.NulCharacterError(
            f'argument "{name}" holds the character U+0000, which jsonb cannot store')
    return Jsonb(value)


def claim(ext: Extension, key: str, *, request: Any, scope: str, ttl: Optional[timedelta],
          lease: Optional[timedelta], fingerprint: Optional[bytes],
          wait: Optional[timedelta]) -> Call:
    if wait is not None:
        ext.require("idem_claim(wait => ...)", V1_2)
    return _call(ext, "idem_claim", ["key"], {
        "request": _json("request", request),
        "scope": scope, "ttl": ttl, "lease": lease, "fingerprint": fingerprint, "wait": wait,
    }, {"key": key})


def _finish_extras(ext: Extension, function: str, ttl: Optional[timedelta],
                   body: Optional[bytes], headers: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    if ttl is not None:
        ext.require(f"{function}(ttl => ...)", V1_2)
    if body is not None or headers is not None:
        ext.require(f"{function}(body => ..., headers => ...)", V1_2)
    return {"ttl": ttl, "body": body,
            "headers": _json("headers", None if headers is None else dict(headers))}


def complete(ext: Extension, key: str, response: Any, *, response_code: int, scope: str,
             attempt: Optional[int], ttl: Optional[timedelta], body: Optional[bytes],
             headers: Optional[Mapping[str, Any]], read_row: bool = True) -> Call:
    extras = _finish_extras(ext, "idem_complete", ttl, body, headers)
    # Before 1.2 a response is required: a handler that answers nothing stores JSON null.
    stored = _json("response", response) if response is not None or body is None else None
    if stored is None and body is None:
        stored = Jsonb(None)
    return _call(ext, "idem_complete", ["key", "response"], {
        "response_code": response_code, "scope": scope, "attempt": attempt, **extras,
    }, {"key": key, "response": stored}, read_row)


def fail(ext: Extension, key: str, response: Any, *, response_code: int, retryable: bool,
         scope: str, attempt: Optional[int], ttl: Optional[timedelta], body: Optional[bytes],
         headers: Optional[Mapping[str, Any]], read_row: bool = True) -> Call:
    extras = _finish_extras(ext, "idem_fail", ttl, body, headers)
    return _call(ext, "idem_fail", ["key"], {
        "response": _json("response", response),
        "response_code": response_code, "retryable": retryable, "scope": scope,
        "attempt": attempt, **extras,
    }, {"key": key}, read_row)


def finish(ext: Extension, key: str, reply: Reply, *, scope: str, attempt: Optional[int],
           read_row: bool) -> Call:
    """idem_fail for a failed reply, else idem_complete."""
    if reply.failed:
        return fail(ext, key, reply.response, response_code=reply.code,
                    retryable=reply.retryable, scope=scope, attempt=attempt, ttl=None,
                    body=reply.body, headers=reply.headers, read_row=read_row)
    return complete(ext, key, reply.response, response_code=reply.code, scope=scope,
                    attempt=attempt, ttl=None, body=reply.body, headers=reply.headers,
                    read_row=read_row)


def lookup(ext: Extension, key: str, *, scope: str) -> Call:
    # A missing key is a NULL composite, which SELECT * expands into a row of NULLs: parse_key_row
    # reads that row (key is NOT NULL in the table) as None.
    return _call(ext, "idem_lookup", ["key"], {"scope": scope}, {"key": key})


def extend(ext: Extension, key: str, attempt: int, lease: timedelta, *, scope: str) -> Call:
    ext.require("idem_extend", V1_2)
    return _call(ext, "idem_extend", ["key", "attempt", "lease"], {"scope": scope},
                 {"key": key, "attempt": attempt, "lease": lease})


def release(ext: Extension, key: str, attempt: int, *, scope: str) -> Call:
    ext.require("idem_release", V1_2)
    return _call(ext, "idem_release", ["key", "attempt"], {"scope": scope},
                 {"key": key, "attempt": attempt})


def forget(ext: Extension, key: str, *, scope: str, force: bool) -> Call:
    ext.require("idem_forget", V1_2)
    return _call(ext, "idem_forget", ["key"], {"scope": scope, "force": force}, {"key": key})


def retry_after_seconds(retry_after: Optional[timedelta], retry_after_s: Optional[int]) -> int:
    """Retry-After in whole seconds: the server's estimate (1.2), else ceil(retry_after)."""
    if retry_after_s is not None:
        return retry_after_s
    if retry_after is None:
        return 1
    return max(1, math.ceil(retry_after.total_seconds()))


def parse_claim(row: Sequence[Any]) -> ClaimResult:
    """A claim's row, read with ``Extension.columns("idem_claim")``."""
    outcome, inserted, attempt, state, response, code, retry_after, expires_at = row[:8]
    has_1_2 = len(row) > 8
    return ClaimResult(
        outcome=Outcome(outcome),
        inserted=bool(inserted),
        attempt=attempt,
        state=None if state is None else State(state),
        response=response,
        response_code=code,
        retry_after=retry_after,
        retry_after_s=row[10] if has_1_2 else None,
        expires_at=expires_at,
        response_body=_bytes(row[8]) if has_1_2 else None,
        response_headers=row[9] if has_1_2 else None,
    )


def parse_key_row(row: Optional[Sequence[Any]]) -> Optional[KeyRow]:
    """A key's row, read with ``Extension.columns(...)`` of a function returning idem_keys."""
    if row is None or row[1] is None:
        return None
    has_1_2 = len(row) > 12
    return KeyRow(
        scope=row[0], key=row[1], state=State(row[2]), attempt=row[3],
        fingerprint=_bytes(row[4]), response=row[5], response_code=row[6], retryable=row[7],
        created_at=row[8], locked_until=row[9], completed_at=row[10], expires_at=row[11],
        response_body=_bytes(row[12]) if has_1_2 else None,
        response_headers=row[13] if has_1_2 else None,
    )


def _bytes(value: Any) -> Optional[bytes]:
    return None if value is None else bytes(value)


def typed(error: psycopg.Error) -> Exception:
    """The package's typed error for a driver error, or the driver error itself."""
    return errors.translate(error) or error


def retries_transaction(error: BaseException) -> bool:
    """40001 and 40P01: the whole transaction may be run again."""
    if isinstance(error, errors.DatabaseError):
        return error.retry_transaction
    return isinstance(error, psycopg.Error) and error.sqlstate in ("40001", "40P01")
