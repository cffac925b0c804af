"""Fixtures: one database per installed extension version (1.1, and 1.2 when available), each
with the extension and the tables the test applications write to."""

from __future__ import annotations

import os
import uuid
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
"""


def admin_dsn() -> str:
    dsn = os.environ.get("IDEMPOTENCY_TEST_DSN")
    if not dsn:
        raise RuntimeError("IDEMPOTENCY_TEST_DSN is not set: run the tests with ./run-tests")
    return dsn


def available_versions() -> list[str]:
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT version FROM pg_available_extension_versions"
            " WHERE name = 'idempotency' AND version IN ('1.1', '1.2') ORDER BY version"
        ).fetchall()
    return [r[0] for r in rows]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ext_version" in metafunc.fixturenames:
        versions = available_versions()
        marker = metafunc.definition.get_closest_marker("versions")
        if marker is not None:  # a test of one version's behaviour runs only against it
            versions = [v for v in versions if v in marker.args]
        if metafunc.definition.get_closest_marker("newest"):
            versions = versions[-1:]
        metafunc.parametrize("ext_version", versions, scope="session")


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
    with psycopg.connect(target, autocommit=True) as conn:
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


@pytest.fixture
def key() -> str:
    return "k-" + uuid.uuid4().hex
