"""Idempotency keys stored in PostgreSQL by the ``idempotency`` extension, for psycopg 3.

``Idempotency`` (sync) and ``AsyncIdempotency`` (asyncio) wrap the extension's SQL API with typed
results and typed errors and run handlers in its two modes; ``pg_idempotency.flask`` and
``pg_idempotency.fastapi`` turn that into HTTP ``Idempotency-Key`` support.
"""

from . import errors
from .aio import AsyncIdempotency
from .client import Idempotency
from .lease import KeyContext, Lease
from .results import (ClaimResult, Executed, InProgress, KeyRow, Outcome, Replayed, Reply,
                      RunResult, State)

__all__ = [
    "AsyncIdempotency", "ClaimResult", "Executed", "Idempotency", "InProgress", "KeyContext",
    "KeyRow", "Lease", "Outcome", "Replayed", "Reply", "RunResult", "State", "errors",
]
