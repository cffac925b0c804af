"""The few concurrency primitives the runners use, in the two flavours: aio.py is written with
the asyncio names (``AEvent``, ``aspawn``, ``ajoin``, ``await_event``), and
tools/generate_sync.py maps each to its threading twin (``Event``, ``spawn``, ``join``,
``wait_event``) when it writes client.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Coroutine

AEvent = asyncio.Event
Event = threading.Event


def aspawn(work: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
    return asyncio.create_task(work())


def spawn(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work, name="idempotency-heartbeat", daemon=True)
    thread.start()
    return thread


async def ajoin(task: asyncio.Task[None]) -> None:
    await task


def join(thread: threading.Thread) -> None:
    thread.join()


async def await_event(event: asyncio.Event, seconds: float) -> bool:
    """Whether the event was set within ``seconds``."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except asyncio.TimeoutError:
        return False
    return True


def wait_event(event: threading.Event, seconds: float) -> bool:
    """Whether the event was set within ``seconds``."""
    return event.wait(seconds)
