"""The lease a handler holds in lease mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Lease:
    """The key as this attempt owns it.

    Pass ``key`` (and ``attempt``) on to an external provider's own idempotency key: the lease
    fences the key's row, not the provider, so a call may run again after a takeover.
    """

    key: str
    scope: str
    attempt: int
    #: True when this claim created the key, False for a takeover of an abandoned or failed one
    inserted: bool
    #: set by the heartbeat when the key was taken over (or finished) under this attempt: stop
    #: the work, its result will be refused with StaleAttemptError
    lost: Optional[Exception] = field(default=None)
    #: the last error of a heartbeat that could not reach the database (it tries again)
    heartbeat_error: Optional[Exception] = field(default=None)
