"""Typed results of the extension's functions and of the runners."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Mapping, Optional, Union


class Outcome(str, Enum):
    CLAIMED = "claimed"
    REPLAY = "replay"
    IN_PROGRESS = "in_progress"


class State(str, Enum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class ClaimResult:
    """One row of ``idem_claim``: what to do with the key."""

    outcome: Outcome
    inserted: bool
    #: fencing token; NULL only for an in_progress answer on an uncommitted claim (1.2 ``wait``)
    attempt: Optional[int]
    state: Optional[State]
    response: Any
    response_code: Optional[int]
    retry_after: Optional[timedelta]
    #: whole seconds for an HTTP Retry-After header; set with in_progress, else None
    retry_after_s: Optional[int]
    expires_at: Optional[datetime]
    #: version 1.2: the stored raw body and headers of a replay
    response_body: Optional[bytes] = None
    response_headers: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class KeyRow:
    """One row of ``idem_keys`` (what complete, fail, extend, release and lookup return)."""

    scope: str
    key: str
    state: State
    attempt: int
    fingerprint: Optional[bytes]
    response: Any
    response_code: Optional[int]
    retryable: Optional[bool]
    created_at: datetime
    locked_until: Optional[datetime]
    completed_at: Optional[datetime]
    expires_at: datetime
    response_body: Optional[bytes] = None
    response_headers: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class Reply:
    """What a handler answers; the runner stores it with the key.

    ``response`` is the JSON value stored in ``idem_keys.response``; ``body`` and ``headers`` are
    stored byte for byte (version 1.2). A reply with ``failed`` set finishes the key with
    ``idem_fail`` (``retryable`` decides whether a later claim takes the key over), otherwise
    with ``idem_complete``.
    """

    response: Any = None
    code: int = 200
    body: Optional[bytes] = None
    headers: Optional[Mapping[str, str]] = None
    failed: bool = False
    retryable: bool = False

    @classmethod
    def failure(
        cls, response: Any = None, code: int = 500, *, retryable: bool = True,
        body: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None,
    ) -> "Reply":
        return cls(response, code, body, headers, failed=True, retryable=retryable)


@dataclass(frozen=True)
class Executed:
    """The handler ran and its reply is stored in ``row``.

    ``row`` is None when, in same-transaction mode, the reply was a retryable failure: the
    transaction was rolled back with the key, so a retry runs afresh.
    """

    reply: Reply
    row: Optional[KeyRow]


@dataclass(frozen=True)
class Replayed:
    """The key was already finished: return the stored answer."""

    claim: ClaimResult

    @property
    def response(self) -> Any:
        return self.claim.response

    @property
    def code(self) -> Optional[int]:
        return self.claim.response_code

    @property
    def state(self) -> Optional[State]:
        return self.claim.state


@dataclass(frozen=True)
class InProgress:
    """Another request owns the key: answer 409 with ``Retry-After: retry_after_s``."""

    retry_after_s: int
    attempt: Optional[int] = field(default=None)


RunResult = Union[Executed, Replayed, InProgress]
