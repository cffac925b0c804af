"""What a handler knows of its key: the context of both modes, and the lease of lease mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class KeyContext:
    """The key this request holds (docs/http.md): what a handler passes on, e.g. to a
    provider's own idempotency key, or logs."""

    key: str
    scope: str
    #: fencing token: 1 for the first claim, one more for each takeover
    attempt: int
    #: True when this claim created the key, False for a takeover of an abandoned or failed one
    inserted: bool


@dataclass
class Lease(KeyContext):
    """The key as this attempt owns it in lease mode.

    Pass ``key`` (and ``attempt``) on to an external provider's own idempotency key: the lease
    fences the key's row, not the provider, so a call may run again after a takeover.
    """

    #: set by the heartbeat when the key was taken over (or finished, or forgotten) under this
    #: attempt: stop the work; its result is not stored and the runner raises this error
    lost: Optional[Exception] = field(default=None)
    #: the last error of a heartbeat that could not reach the database (it tries again)
    heartbeat_error: Optional[Exception] = field(default=None)
