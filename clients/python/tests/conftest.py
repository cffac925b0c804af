"""Fixtures: one database per tested extension version (1.1, and the default version when it is
newer: 1.2 or later), each with the extension and the tables the test applications write to.

IDEMPOTENCY_EDITION=sql runs the same tests against the SQL edition (docs/editions.md): each
database gets its plain-SQL install (``psql -f`` of IDEMPOTENCY_SQL_EDITION_FILE, schema public)
instead of CREATE EXTENSION, at the SQL edition's version; a test of one of its documented
differences is marked ``sql_edition_difference(reason)`` and skipped with that reason."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

SCHEMA = """
CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, total integer NOT NULL,
                     idem_key text);
CREATE TABLE handler_runs (idem_key text NOT NULL, attempt integer, pid integer);
CREATE TABLE provider_charges (provider_key text PRIMARY KEY, attempt integer NOT NULL);
CREATE TABLE conformance_starts (run text NOT NULL);
CREATE TABLE conformance_writes (run text NOT NULL);
"""


def admin_dsn() -> str:
    dsn = os.environ.get("IDEMPOTENCY_TEST_DSN")
    if not dsn:
        raise RuntimeError("IDEMPOTENCY_TEST_DSN is not set: run the tests with ./run-tests")
    return dsn


def edition_under_test() -> str:
    """The edition under test: "c" (the extension) or "sql" (the SQL edition's plain route)."""
    name = os.environ.get("IDEMPOTENCY_EDITION", "c")
    if name not in ("c", "sql"):
        raise RuntimeError(f"IDEMPOTENCY_EDITION is c or sql, not {name}")
    return name


def sql_edition_file() -> Path:
    """sql-edition/build's plain/idempotency-VERSION.sql."""
    file = os.environ.get("IDEMPOTENCY_SQL_EDITION_FILE")
    if not file:
        raise RuntimeError("IDEMPOTENCY_SQL_EDITION_FILE is not set: run the tests with ./run-tests")
    return Path(file)


def available_versions() -> list[str]:
    """1.1 and the installed default version (the client compares versions: 1.3 has 1.2's API);
    the SQL edition: its one version."""
    if edition_under_test() == "sql":
        match = re.fullmatch(r"idempotency-(.+)\.sql", sql_edition_file().name)
        if match is None:
            raise RuntimeError(f"{sql_edition_file()} is not a plain/idempotency-VERSION.sql")
        return [match.group(1)]
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT v.version FROM pg_available_extension_versions v"
            " JOIN pg_available_extensions e USING (name)"
            " WHERE v.name = 'idempotency' AND (v.version = '1.1' OR v.version = e.default_version)"
            " ORDER BY v.version = e.default_version, v.version"
        ).fetchall()
    return [r[0] for r in rows]


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("sql_edition_difference")
    if marker is not None and edition_under_test() == "sql":
        pytest.skip(f"SQL edition (docs/editions.md): {marker.args[0]}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ext_version" in metafunc.fixturenames:
        versions = available_versions()
        marker = metafunc.definition.get_closest_marker("versions")
        if marker is not None:  # a test of one version's behaviour runs only against it
            wanted: list[Any] = [v for v in versions
                                 if any(_has_api(v, api) for api in marker.args)]
            if not wanted and edition_under_test() == "sql":
                # the SQL edition has one version: a test of an older one's behaviour says so
                reason = (f"SQL edition (docs/editions.md): no version {', '.join(marker.args)},"
                          f" its version is {versions[0]}")
                wanted = [pytest.param(versions[0], marks=pytest.mark.skip(reason=reason))]
            versions = wanted
        if metafunc.definition.get_closest_marker("newest"):
            versions = versions[-1:]
        metafunc.parametrize("ext_version", versions, scope="session")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _has_api(version: str, api: str) -> bool:
    """1.1 tests what is missing there (that version alone); later versions keep 1.2's API."""
    return version == api or (api != "1.1" and _version(version) >= _version(api))


@pytest.fixture(scope="session")
def edition() -> str:
    return edition_under_test()


@pytest.fixture(scope="session")
def databases() -> dict[str, str]:
    """Databases made in this session, by version: pytest may set a parametrized session
    fixture up again when it changes versions, and an application may still use the old one."""
    return {}


@pytest.fixture(scope="session")
def dsn(ext_version: str, databases: dict[str, str]) -> str:
    if ext_version in databases:
        return databases[ext_version]
    name = "idem_py_" + ext_version.replace(".", "_")
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = psycopg.conninfo.make_conninfo(admin_dsn(), dbname=name)
    if edition_under_test() == "sql":
        subprocess.run([os.environ.get("PSQL", "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                        "-d", target, "-f", str(sql_edition_file())],
                       check=True, stdout=subprocess.DEVNULL)
    with psycopg.connect(target, autocommit=True) as conn:
        if edition_under_test() == "c":
            conn.execute(sql.SQL("CREATE EXTENSION idempotency VERSION {}").format(
                sql.Literal(ext_version)))
        conn.execute(SCHEMA)
    databases[ext_version] = target
    return target


@pytest.fixture(scope="session")
def pool(dsn: str) -> Iterator[ConnectionPool]:
    with ConnectionPool(dsn, min_size=2, max_size=20, open=True) as p:
        yield p


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="session")
def markers() -> Iterator[Path]:
    """Where the test applications' handlers tell a test that they started."""
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@pytest.fixture
def key() -> str:
    return "k-" + uuid.uuid4().hex
