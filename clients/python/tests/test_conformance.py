"""The shared conformance vectors of the HTTP contract (clients/conformance/vectors.json, its
format in clients/conformance/README.md): every vector, in each of its modes, against real
servers over real HTTP and the real extension (Flask under werkzeug, FastAPI under uvicorn,
Django's sync and ``async def`` views under werkzeug's WSGI server, its ``async def`` views under
uvicorn); the
fixed fingerprints against ``pg_idempotency.http.fingerprint`` and the scopes against
``http_scope``."""

from __future__ import annotations

import base64
import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import psycopg
import pytest

import rawhttp
from pg_idempotency.http import fingerprint, http_scope
from test_http import ALICE, App, answer_without_sending_the_body, wait_for

CONFORMANCE_FRAMEWORKS = ["flask", "fastapi", "django-wsgi", "django-wsgi-async", "django-asgi"]
#: what a WSGI server cannot give: the field lines of a repeated header (werkzeug, gunicorn and
#: wsgiref join them with "," into one environ value), so under WSGI the lines "a" and "b" are
#: the value "a,b" (README "Repeated headers"); tests/test_http.py checks that rule instead
WSGI_CANNOT = {"repeated-fingerprint-header"}
WSGI = {"flask", "django-wsgi", "django-wsgi-async"}

#: the repository's clients/conformance, beside clients/python
VECTORS_FILE = Path(__file__).resolve().parents[2] / "conformance" / "vectors.json"
MISSING = "the vectors file is missing"


def _load() -> Optional[dict[str, Any]]:
    if not VECTORS_FILE.is_file():
        return None
    data: dict[str, Any] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
    return data


DATA = _load()
# a missing file is one failing case, never an empty (skipped) parametrization
CASES = ([(framework, index, vector["name"], mode)
          for framework in CONFORMANCE_FRAMEWORKS
          for index, vector in enumerate(DATA["vectors"]) for mode in vector["modes"]
          if not (framework in WSGI and vector["name"] in WSGI_CANNOT)]
         if DATA is not None else [(framework, -1, MISSING, "")
                                   for framework in CONFORMANCE_FRAMEWORKS])
FINGERPRINTS = DATA["fingerprints"] if DATA is not None else [{"name": MISSING}]
SCOPES = DATA["scopes"] if DATA is not None else [{"name": MISSING}]


def _require_vectors() -> dict[str, Any]:
    if DATA is None:
        pytest.fail(f"{VECTORS_FILE} is missing: the conformance vectors come from"
                    " clients/conformance in the repository")
    assert DATA["format"] == 1, "a vectors format this runner does not know"
    return DATA


@pytest.fixture(scope="session")
def conformance_framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def conformance_apps() -> Iterator[dict[tuple[str, str], Union[App, Exception]]]:
    apps: dict[tuple[str, str], Union[App, Exception]] = {}
    yield apps
    for running in apps.values():
        if isinstance(running, App):
            running.stop()


@pytest.fixture
def conformance_app(conformance_framework: str, dsn: str, markers: Path,
                    conformance_apps: dict[tuple[str, str], Union[App, Exception]]) -> App:
    """One application per framework and database; one that failed to start fails every
    vector at once (instead of each waiting for it again)."""
    if (conformance_framework, dsn) not in conformance_apps:
        try:
            conformance_apps[conformance_framework, dsn] = App(
                f"{conformance_framework}-conformance", dsn, markers,
                {"CONFORMANCE_VECTORS": str(VECTORS_FILE)})
        except RuntimeError as exc:
            conformance_apps[conformance_framework, dsn] = exc
    app = conformance_apps[conformance_framework, dsn]
    if isinstance(app, Exception):
        raise app
    return app


def _count(conn: psycopg.Connection[Any], table: str, run: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table} WHERE run = %s", (run,)).fetchone()
    assert row is not None
    return int(row[0])


def _check(expect: dict[str, Any], answer: rawhttp.Answer, answers: dict[int, rawhttp.Answer],
           conn: psycopg.Connection[Any], run: str, where: str) -> None:
    where = f"{where}: {answer.status} {answer.headers} {answer.body[:300]!r}"
    if "status" in expect:
        assert answer.status == expect["status"], where
    if "replayed" in expect:
        replayed = answer.header("Idempotent-Replayed")
        assert (replayed == "true") if expect["replayed"] else replayed is None, where
    if "code" in expect:
        assert (answer.header("Content-Type") or "").startswith("application/problem+json"), where
        problem = json.loads(answer.body)
        assert problem["code"] == expect["code"] and problem["status"] == answer.status, where
        assert problem["type"] == "about:blank" and problem["title"] and problem["detail"], where
    if "retry_after" in expect:
        retry_after = answer.header("Retry-After")
        assert (retry_after is not None and retry_after.isdigit()) == expect["retry_after"], where
    if "same_body_as" in expect:
        assert answer.body == answers[expect["same_body_as"]].body, where
    if "body_differs_from" in expect:
        assert answer.body != answers[expect["body_differs_from"]].body, where
    if "handler_runs" in expect:
        assert _count(conn, "conformance_starts", run) == expect["handler_runs"], where
    if "committed_writes" in expect:
        assert _count(conn, "conformance_writes", run) == expect["committed_writes"], where
    for name, value in expect.get("headers", []):
        assert value in [v for k, v in answer.headers if k.lower() == name.lower()], where


@pytest.mark.parametrize("conformance_framework, index, name, mode", CASES,
                         indirect=["conformance_framework"],
                         ids=[f"{framework}-{name}-{mode}" if mode else f"{framework}-{name}"
                              for framework, _, name, mode in CASES])
def test_vector(index: int, name: str, mode: str, conformance_framework: str,
                conn: psycopg.Connection[Any], markers: Path, request: pytest.FixtureRequest
                ) -> None:
    vector = _require_vectors()["vectors"][index]
    app: App = request.getfixturevalue("conformance_app")
    run = f"{conformance_framework}-v{index}-{mode}"
    for marker in (f"{run}.held", f"{run}.release"):  # left by the run on another database
        (markers / marker).unlink(missing_ok=True)
    answers: dict[int, rawhttp.Answer] = {}
    pending: dict[int, Future[rawhttp.Answer]] = {}

    def send(r: dict[str, Any]) -> rawhttp.Answer:
        body = (r["body_text"].encode("utf-8") if "body_text" in r
                else base64.b64decode(r["body_base64"]) if "body_base64" in r else None)
        if body is not None and "body_repeat" in r:
            body *= r["body_repeat"]
        return rawhttp.send(app.port, r["method"], f"/{run}{r['target']}",
                            [(h[0], h[1]) for h in r.get("headers", [])], body,
                            chunked=r.get("chunked", False))

    with ThreadPoolExecutor(4) as background:
        for i, step in enumerate(vector["steps"]):
            where = f"{name} ({mode}, {conformance_framework}) step {i}"
            if "request" in step and step.get("hold"):
                pending[i] = background.submit(send, step["request"])
                wait_for(markers / f"{run}.held", timeout=120)  # its handler started
            elif "request" in step and step.get("background"):
                pending[i] = background.submit(send, step["request"])
            elif "request" in step:
                answers[i] = send(step["request"])
                _check(step["expect"], answers[i], answers, conn, run, where)
            else:
                waited = step["release"] if "release" in step else step["await"]
                if "release" in step:
                    (markers / f"{run}.release").write_text("go")
                answers[waited] = pending.pop(waited).result(timeout=120)
                _check(step["expect"], answers[waited], answers, conn, run, where)
        assert not pending, f"{name}: steps never awaited: {sorted(pending)}"


@pytest.mark.parametrize("case", FINGERPRINTS, ids=[f["name"] for f in FINGERPRINTS])
def test_fingerprint_vector(case: dict[str, Any]) -> None:
    _require_vectors()
    lines = case["headers"]
    chosen = []
    for name in case["fingerprint_headers"]:
        values = [value for header, value in lines if header.lower() == name.lower()]
        chosen.append((name, ", ".join(values) if values else None))
    got = fingerprint(case["method"], case["target"].encode("utf-8"), case["content_type"],
                      base64.b64decode(case["body_base64"]), chosen)
    assert got.hex() == case["sha256"]


@pytest.mark.parametrize("case", SCOPES, ids=[c["name"] for c in SCOPES])
def test_scope_vector(case: dict[str, Any]) -> None:
    _require_vectors()
    assert http_scope(case["method"], case["route"], case["tenant"], case["caller"]) \
        == case["scope"]


@pytest.mark.parametrize("conformance_framework", sorted(WSGI) + ["fastapi"], indirect=True)
def test_a_body_over_the_limit_is_never_read_to_its_end(conformance_framework: str, dsn: str,
                                                        request: pytest.FixtureRequest) -> None:
    """The route of the vector body-over-limit (64 bytes): a GiB announced and nothing sent,
    then a chunked body never ended, are answered 413 (a server that read them to their end
    would never answer). Django under ASGI is not here: Django's own ASGI handler receives the
    whole body before any view runs (README "Bodies")."""
    names = [v["name"] for v in _require_vectors()["vectors"]]
    index = names.index("body-over-limit")
    app: App = request.getfixturevalue("conformance_app")
    target = f"/{conformance_framework}-v{index}-transaction/orders".encode()
    head = [b"POST " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Idempotency-Key: k-endless",
            b"Authorization: " + ALICE["Authorization"].encode(),
            b"Content-Type: application/octet-stream"]
    declared = answer_without_sending_the_body(app.port, head + [b"Content-Length: 1073741824"],
                                               b"")
    streamed = answer_without_sending_the_body(app.port, head + [b"Transfer-Encoding: chunked"],
                                               (b"200\r\n" + b"x" * 512 + b"\r\n") * 8)
    for answer in (declared, streamed):
        assert answer.status == 413, answer
        assert json.loads(answer.body)["code"] == "idempotency_body_too_large"
