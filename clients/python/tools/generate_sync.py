#!/usr/bin/python3
"""Write the sync client (src/pg_idempotency/client.py) from the async one (aio.py).

aio.py is the one source of the runners. The generator walks its syntax tree and edits the
source text where the tree says so: ``async``/``await`` go, the asyncio names become their sync
twins (``NAMES``), ``Awaitable[T]`` becomes ``T``, ``await c.set_autocommit(v)`` becomes
``c.autocommit = v`` (psycopg 3.1's sync connection has no setter method). Editing the text
rather than unparsing the tree keeps the comments and the layout; continuation lines aligned
with an opening bracket that moved are moved with it.

    tools/generate_sync.py          rewrite client.py
    tools/generate_sync.py --check  exit 1 if client.py is not what aio.py generates
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Optional

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "pg_idempotency"
SOURCE = PACKAGE / "aio.py"
TARGET = PACKAGE / "client.py"

#: asyncio name -> sync name, wherever it appears: code, imports, docstrings
NAMES = {
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncIdempotency": "Idempotency",
    "_AsyncHeartbeat": "_Heartbeat",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "run_async": "run",
    "AEvent": "Event",
    "aspawn": "spawn",
    "ajoin": "join",
    "await_event": "wait_event",
}
#: names the sync code does not need
DROPPED = {"Awaitable"}
SETTERS = {"set_autocommit": "autocommit"}
_WORD = re.compile(r"\b(" + "|".join(map(re.escape, NAMES)) + r")\b")

HEADER = """\
# Generated from aio.py by tools/generate_sync.py: do not edit. Change aio.py, then run
# tools/generate_sync.py (tests/test_generated.py fails while this file differs from its output).
"""


class _Edits(ast.NodeVisitor):
    """Collects (line, start column, end column, replacement) edits, all within one line (the
    module docstring aside: its edit spans lines). Columns are offsets in the line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.edits: list[tuple[int, int, int, str]] = []
        self.module_docstring: Optional[tuple[int, int, int, int, str]] = None

    def replace(self, line: int, start: int, end: int, text: str) -> None:
        self.edits.append((line, start, end, text))

    def drop_keyword(self, node: ast.AST, keyword: str) -> None:
        line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        assert self.lines[line - 1].startswith(keyword + " ", col), (line, keyword)
        self.replace(line, col, col + len(keyword) + 1, "")

    def rename_at(self, line: int, col: int, name: str) -> None:
        assert self.lines[line - 1].startswith(name, col), (line, name)
        self.replace(line, col, col + len(name), NAMES[name])

    def visit_Module(self, node: ast.Module) -> None:
        doc = node.body[0]
        assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
        first = _WORD.sub(lambda m: NAMES[m[1]], doc.value.value.split("\n\n")[0])
        assert doc.end_lineno is not None and doc.end_col_offset is not None
        self.module_docstring = (doc.lineno, doc.col_offset, doc.end_lineno,
                                 doc.end_col_offset, f'"""{first}"""')
        for statement in node.body[1:]:
            self.visit(statement)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = [alias.name for alias in node.names]
        if not any(name in NAMES or name in DROPPED for name in names):
            return
        kept = sorted(NAMES.get(name, name) for name in names if name not in DROPPED)
        text = f"from {'.' * node.level}{node.module or ''} import {', '.join(kept)}"
        assert node.lineno == node.end_lineno and len(text) <= 100, text
        assert node.end_col_offset is not None
        self.replace(node.lineno, node.col_offset, node.end_col_offset, text)

    def _definition(self, node: ast.AST, name: str, keyword: str) -> None:
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)
        line = node.lineno  # type: ignore[attr-defined]
        found = re.compile(rf"(async )?{keyword} ({re.escape(name)})\b").match(
            self.lines[line - 1], node.col_offset)  # type: ignore[attr-defined]
        assert found, (line, name)
        if found[1]:
            self.drop_keyword(node, "async")
        if name in NAMES:
            self.rename_at(line, found.start(2), name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._definition(node, node.name, "class")
        for child in [*node.bases, *node.keywords, *node.body]:
            self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._definition(node, node.name, "def")
        for child in [node.args, *node.body]:
            self.visit(child)
        if node.returns is not None:
            self.visit(node.returns)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)  # type: ignore[arg-type]

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self.drop_keyword(node, "async")
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self.drop_keyword(node, "async")
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        # await conn.set_autocommit(value) -> conn.autocommit = value
        call = node.value.value if isinstance(node.value, ast.Await) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in SETTERS):
            target = ast.get_source_segment("\n".join(self.lines), call.func.value)
            value = ast.get_source_segment("\n".join(self.lines), call.args[0])
            assert node.lineno == node.end_lineno and node.end_col_offset is not None
            self.replace(node.lineno, node.col_offset, node.end_col_offset,
                         f"{target}.{SETTERS[call.func.attr]} = {value}")
            return
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self.drop_keyword(node, "await")
        self.visit(node.value)

    def _unwrap_await(self, node: ast.Attribute | ast.Subscript) -> None:
        """``(await f()).x`` -> ``f().x``: the parentheses go with the await."""
        inner = node.value
        if isinstance(inner, ast.Await) and isinstance(inner.value, (ast.Call, ast.Name,
                                                                      ast.Attribute)):
            end, end_col = inner.end_lineno, inner.end_col_offset
            assert end is not None and end_col is not None
            assert self.lines[inner.lineno - 1][inner.col_offset - 1] == "("
            assert self.lines[end - 1][end_col] == ")"
            self.replace(inner.lineno, inner.col_offset - 1, inner.col_offset, "")
            self.replace(end, end_col, end_col + 1, "")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._unwrap_await(node)
        self.visit(node.value)
        if node.attr in NAMES:
            assert node.end_col_offset is not None and node.end_lineno is not None
            self.rename_at(node.end_lineno, node.end_col_offset - len(node.attr), node.attr)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in DROPPED:
            # Awaitable[T] -> T
            assert node.lineno == node.end_lineno and node.end_col_offset is not None
            assert node.slice.end_col_offset is not None
            self.replace(node.lineno, node.col_offset, node.slice.col_offset, "")
            self.replace(node.lineno, node.slice.end_col_offset, node.end_col_offset, "")
            self.visit(node.slice)
            return
        self._unwrap_await(node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        assert node.id not in DROPPED, (node.lineno, node.id)
        if node.id in NAMES:
            self.rename_at(node.lineno, node.col_offset, node.id)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str):
            return
        assert node.end_lineno is not None and node.end_col_offset is not None
        for number in range(node.lineno, node.end_lineno + 1):
            line = self.lines[number - 1]
            first = node.col_offset if number == node.lineno else 0
            last = node.end_col_offset if number == node.end_lineno else len(line)
            for found in _WORD.finditer(line, first, last):
                self.rename_at(number, found.start(), found[1])


def _dedents(source: str, edits: list[tuple[int, int, int, str]]) -> dict[int, int]:
    """How far each continuation line aligned with an opening bracket moves left: as far as
    that bracket moved (by the edits before it on its line, and its own line's move)."""
    removed: dict[int, list[tuple[int, int]]] = {}
    for line, start, end, text in edits:
        removed.setdefault(line, []).append((end, end - start - len(text)))
    dedent: dict[int, int] = {}
    brackets: list[list[int]] = []  # [column, shift, visual: 1, 0, or -1 while unknown]
    previous_line = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NL, tokenize.NEWLINE):
            continue
        line, col = token.start
        if brackets and brackets[-1][2] == -1:
            brackets[-1][2] = int(line == previous_line)
        if line != previous_line and brackets:
            column, shift, visual = brackets[-1]
            if visual and col == column + 1 and shift:
                dedent[line] = shift
        previous_line = token.end[0]
        if token.type != tokenize.OP:
            continue
        if token.string in "([{":
            shift = dedent.get(line, 0) + sum(n for end, n in removed.get(line, []) if end <= col)
            brackets.append([col, shift, -1])
        elif token.string in ")]}":
            brackets.pop()
    return dedent


def generate(source: str) -> str:
    """The sync module for the async module's source."""
    assert source.isascii(), "columns are counted in characters: keep aio.py ASCII"
    lines = source.split("\n")
    collector = _Edits(lines)
    collector.visit(ast.parse(source))
    edits = collector.edits
    for line, shift in _dedents(source, edits).items():
        assert lines[line - 1].startswith(" " * shift), line
        edits.append((line, 0, shift, ""))
    by_line: dict[int, list[tuple[int, int, str]]] = {}
    for line, start, end, text in edits:
        by_line.setdefault(line, []).append((start, end, text))
    for number, changes in by_line.items():
        text = lines[number - 1]
        previous_start = len(text)
        for start, end, replacement in sorted(changes, reverse=True):
            assert end <= previous_start, f"overlapping edits on line {number}"
            text = text[:start] + replacement + text[end:]
            previous_start = start
        lines[number - 1] = text
    assert collector.module_docstring is not None
    first_line, first_col, last_line, last_col, docstring = collector.module_docstring
    assert first_line not in by_line and last_line not in by_line
    lines[first_line - 1:last_line] = [lines[first_line - 1][:first_col] + docstring
                                       + lines[last_line - 1][last_col:]]
    return HEADER + "\n".join(lines)


def main(argv: list[str]) -> int:
    wanted = generate(SOURCE.read_text())
    if argv[1:] == ["--check"]:
        if TARGET.read_text() != wanted:
            print(f"{TARGET} is not what {SOURCE.name} generates: run {argv[0]}")
            return 1
        return 0
    if argv[1:]:
        print(__doc__)
        return 2
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
