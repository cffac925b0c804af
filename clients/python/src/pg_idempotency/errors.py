"""Typed exceptions: one class per SQLSTATE the extension (or PostgreSQL on its calls) raises.

Every database error keeps the driver's exception as ``__cause__`` and exposes ``sqlstate`` and
the HTTP status the contract maps it to, so that an application can answer it without a table of
codes of its own.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import psycopg


class IdempotencyError(Exception):
    """Base class of every error this package raises."""


class UsageError(IdempotencyError):
    """The library was called in a way that cannot work (checked before the database)."""


class OpenTransactionError(UsageError):
    """Lease mode was asked to run on a connection with an open transaction.

    A claim inside a transaction would hold the key's row lock until that transaction ends, so
    duplicates would block on it instead of getting ``in_progress``.
    """


class UnsupportedVersionError(UsageError):
    """The installed extension is older than a feature needs."""

    def __init__(self, feature: str, required: str, installed: str) -> None:
        super().__init__(
            f"{feature} needs idempotency extension version {required}; "
            f"the database has version {installed} (ALTER EXTENSION idempotency UPDATE)"
        )
        self.feature = feature
        self.required = required
        self.installed = installed


class NulCharacterError(UsageError):
    """A JSON value holds U+0000, which jsonb cannot store.

    Refused before it is sent: the server's error (22P05) would quote the JSON into its log.
    """

    http_status = 400


class ExtensionMissingError(UsageError):
    """The connected database has no idempotency extension."""


class DatabaseError(IdempotencyError):
    """An error the server raised on one of the extension's calls."""

    sqlstate: ClassVar[str] = ""
    http_status: ClassVar[int] = 500
    #: retrying the whole transaction may succeed (serialization failures, deadlocks)
    retry_transaction: ClassVar[bool] = False
    #: Retry-After of a 503 answer
    retry_after_s: ClassVar[int] = 1

    def __init__(self, cause: psycopg.Error) -> None:
        diag = cause.diag
        super().__init__(diag.message_primary or str(cause))
        self.cause = cause
        self.detail: Optional[str] = diag.message_detail
        self.hint: Optional[str] = diag.message_hint
        self.sqlstate_received: Optional[str] = cause.sqlstate
        #: the key of a batch call (idem_claim_batch, idem_complete_batch) that the error is
        #: about: the one that failed with IK001 to IK004 or 22003, or a repeated one; the server
        #: sends it in the error's column-name field. None for other errors.
        self.key: Optional[str] = diag.column_name


class KeyMismatchError(DatabaseError):
    """IK001: the key was already used with a different request."""

    sqlstate = "IK001"
    http_status = 422


class StaleAttemptError(DatabaseError):
    """IK002: the key was taken over; this attempt must not report success."""

    sqlstate = "IK002"
    http_status = 409


class KeyNotFoundError(DatabaseError):
    """IK003: no such key (or it expired, from version 1.2)."""

    sqlstate = "IK003"
    http_status = 404


class KeyNotPendingError(DatabaseError):
    """IK004: the key is already finished."""

    sqlstate = "IK004"
    http_status = 409


class KeyInProgressError(DatabaseError):
    """IK005: idem_forget of a key whose lease is live, without force (version 1.2)."""

    sqlstate = "IK005"
    http_status = 409


class InvalidArgumentError(DatabaseError):
    """22023: an argument is out of range or malformed; the message names it."""

    sqlstate = "22023"
    http_status = 400


class NullArgumentError(InvalidArgumentError):
    """22004: a required argument is NULL."""

    sqlstate = "22004"


class InvalidJsonError(DatabaseError):
    """22P02: a request or response is not valid JSON."""

    sqlstate = "22P02"
    http_status = 400


class UntranslatableCharacterError(DatabaseError):
    """22P05: a JSON string holds \\u0000, which jsonb cannot store."""

    sqlstate = "22P05"
    http_status = 400


class SerializationError(DatabaseError):
    """40001: retry the transaction (bounded retries are built into the runners)."""

    sqlstate = "40001"
    http_status = 503
    retry_transaction = True


class DeadlockError(DatabaseError):
    """40P01: retry the transaction."""

    sqlstate = "40P01"
    http_status = 503
    retry_transaction = True


class LockNotAvailableError(DatabaseError):
    """55P03: lock_timeout ran out while waiting for the key."""

    sqlstate = "55P03"
    http_status = 503


class QueryCanceledError(DatabaseError):
    """57014: statement_timeout or a cancel interrupted the call."""

    sqlstate = "57014"
    http_status = 503


class ReadOnlyError(DatabaseError):
    """25006: a writing call in a read-only transaction or on a hot standby."""

    sqlstate = "25006"
    http_status = 503


class RowSecurityNotInForceError(DatabaseError):
    """IK006 (extension 1.5): a restore could not put the recorded tenant policies back; the
    server refuses the roles they would confine until an operator runs
    idem_row_security_apply()."""

    sqlstate = "IK006"
    http_status = 503
    retry_after_s: ClassVar[int] = 5


class ScopeMovedError(DatabaseError):
    """IK900 (scale-out): the scope moved to another partition during the call (a
    resharding); retry."""

    sqlstate = "IK900"
    http_status = 503


class PartitionUnavailableError(DatabaseError):
    """IK901 (scale-out): the scope's partition cannot be reached; retry later."""

    sqlstate = "IK901"
    http_status = 503
    retry_after_s: ClassVar[int] = 5


_BY_SQLSTATE: dict[str, type[DatabaseError]] = {
    cls.sqlstate: cls
    for cls in (
        KeyMismatchError,
        StaleAttemptError,
        KeyNotFoundError,
        KeyNotPendingError,
        KeyInProgressError,
        InvalidArgumentError,
        NullArgumentError,
        InvalidJsonError,
        UntranslatableCharacterError,
        SerializationError,
        DeadlockError,
        LockNotAvailableError,
        QueryCanceledError,
        ReadOnlyError,
        RowSecurityNotInForceError,
        ScopeMovedError,
        PartitionUnavailableError,
    )
}


def translate(error: psycopg.Error) -> Optional[DatabaseError]:
    """The typed error for a driver error, or None when its SQLSTATE is not one of ours."""
    cls = _BY_SQLSTATE.get(error.sqlstate or "")
    return cls(error) if cls is not None else None
