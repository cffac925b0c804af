"""client.py (the sync client) is generated from aio.py by tools/generate_sync.py: the committed
file must be exactly what the generator writes, so that the two runners cannot drift apart."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[1] / "tools" / "generate_sync.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_client_py_is_what_aio_py_generates() -> None:
    tool = generator()
    wanted = tool.generate(tool.SOURCE.read_text())
    assert tool.TARGET.read_text() == wanted, (
        "src/pg_idempotency/client.py differs from what tools/generate_sync.py writes from aio.py:"
        " change aio.py and run the generator, never client.py by hand")


def test_the_sync_client_has_nothing_async_left() -> None:
    tool = generator()
    tree = ast.parse(tool.TARGET.read_text())
    async_nodes = (ast.Await, ast.AsyncFunctionDef, ast.AsyncWith, ast.AsyncFor)
    assert [type(n).__name__ for n in ast.walk(tree) if isinstance(n, async_nodes)] == []
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert names & (set(tool.NAMES) | tool.DROPPED) == set()
