"""What both test applications share: settings from the environment and the fake provider."""

from __future__ import annotations

import json
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path
import uuid
from typing import Any, AsyncIterator, Callable, Optional

import psycopg

DSN = os.environ["APP_DSN"]
MARKERS = Path(os.environ["APP_MARKERS"])


def pool_lifespan(pool: Any) -> Callable[[Any], Any]:
    """The ASGI lifespan that opens the pool at startup and closes it at shutdown (FastAPI 0.92,
    Debian bookworm's, has no lifespan parameter; Starlette 1.0 has no add_event_handler)."""
    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await pool.open()
        try:
            yield
        finally:
            await pool.close()
    return lifespan


def mark_started(key: str) -> None:
    """Tell the test that the handler is running (the kill -9 tests wait for this file)."""
    (MARKERS / key).write_text(str(os.getpid()))


def pause(seconds: float) -> None:
    time.sleep(seconds)


def released(name: str) -> Path:
    """The file a test writes to let a handler held by ``X-Hold`` finish."""
    return MARKERS / f"{name}.release"


def wait_until(condition: Callable[[], bool], timeout: float = 60) -> None:
    """Until the condition holds, such as the heartbeat reporting the lease lost or the test
    releasing a held handler (bounded: a test fails, it never hangs)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def committed_state(key: str) -> str:
    """The key's state as another session sees it: only what is committed."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        row = conn.execute("SELECT state FROM idem_keys WHERE key = %s", (key,)).fetchone()
    return "absent" if row is None else str(row[0])


def order_body(order_id: int) -> bytes:
    # deliberately not canonical JSON (key order, spacing): replays must keep these bytes
    return ('{"order_id": %d,  "status": "created", "a": [1, 2.50]}' % order_id).encode()


def charge_body(key: str, attempt: int) -> bytes:
    return json.dumps({"charge": key, "attempt": attempt}, indent=1).encode()


BINARY_BODY = bytes(range(256)) + b"\x00\xff"


def as_int(value: Any, default: int = 0) -> int:
    return int(value) if value is not None else default


#: the applications' users: the bearer token the application checks, and the user it names
USERS = {"Bearer token-alice": "alice", "Bearer token-bob": "bob", "Bearer token-carol": "carol"}
#: the tenant of a user, as the application's own records say (never a header)
TENANTS = {"carol": "acme"}


def user_of(authorization: Optional[str]) -> Optional[str]:
    """The authenticated user of a request's Authorization header (None: nobody)."""
    return USERS.get(authorization or "")


def tenant_of(authorization: Optional[str]) -> Optional[str]:
    user = user_of(authorization)
    return TENANTS.get(user) if user is not None else None


def fresh_body(user: Optional[str]) -> bytes:
    """A body that differs on every run (a replay is the same bytes) and says whose it is."""
    return json.dumps({"user": user, "token": uuid.uuid4().hex}).encode()
