"""The Flask and FastAPI integrations, over real HTTP: each application runs in its own process
(werkzeug's threaded server, uvicorn) on 127.0.0.1 against the real extension."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import psycopg
import pytest

import rawhttp
from loopback import free_port
from pg_idempotency.http import http_scope

HERE = Path(__file__).parent
FRAMEWORKS = ["flask", "fastapi"]
#: the test applications' users (apps/common.py): a bearer token each
ALICE = {"Authorization": "Bearer token-alice"}
BOB = {"Authorization": "Bearer token-bob"}
CAROL = {"Authorization": "Bearer token-carol"}  # in the tenant "acme"


class App:
    """One application process; kill() is kill -9."""

    def __init__(self, framework: str, dsn: str, markers: Path,
                 environment: Optional[dict[str, str]] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, APP_DSN=dsn, APP_MARKERS=str(markers), **(environment or {}),
                   PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"),
                                               os.environ.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "apps" / "serve.py"), framework, str(self.port)],
            env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {framework} application did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session", params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def started_apps() -> Iterator[dict[tuple[str, str], App]]:
    apps: dict[tuple[str, str], App] = {}
    yield apps
    for running in apps.values():
        running.stop()


@pytest.fixture
def app(framework: str, dsn: str, markers: Path,
        started_apps: dict[tuple[str, str], App]) -> App:
    """One application per framework and database, started once (the tests use fresh keys)."""
    if (framework, dsn) not in started_apps:
        started_apps[framework, dsn] = App(framework, dsn, markers)
    return started_apps[framework, dsn]


@pytest.fixture
def client(app: App) -> Iterator[httpx.Client]:
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=60) as c:
        yield c


def count(conn: psycopg.Connection[Any], query: str, *args: Any) -> int:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return int(row[0])


def key_row(conn: psycopg.Connection[Any], key: str) -> Optional[tuple[Any, ...]]:
    return conn.execute("SELECT state, attempt, retryable, response_code FROM idem_keys"
                        " WHERE key = %s", (key,)).fetchone()


ORDER = {"customer": "ada", "total": 42}


def post_order(client: httpx.Client, key: str, body: Any = None, **params: str) -> httpx.Response:
    # the test's controls are headers: the query string is part of the fingerprint
    controls = {"X-" + name.replace("_", "-").title(): value for name, value in params.items()}
    return client.post("/orders", headers={"Idempotency-Key": key, **controls},
                       json=ORDER if body is None else body)


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never started"
        time.sleep(0.05)


# ---- replay, fingerprints, keys -----------------------------------------------------------

def test_replay_is_byte_exact(client: httpx.Client, conn: psycopg.Connection[Any],
                              key: str) -> None:
    first = post_order(client, key)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    second = post_order(client, key)
    assert second.status_code == 201
    assert second.content == first.content
    assert second.headers["Location"] == first.headers["Location"]
    assert second.headers["Content-Type"] == first.headers["Content-Type"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "X-Not-Replayed" not in second.headers  # only the chosen headers are kept
    order_id = json.loads(first.content)["order_id"]
    assert first.headers["Location"] == f"/orders/{order_id}"
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 1


def test_binary_body_replays_byte_exact(client: httpx.Client, key: str) -> None:
    first = client.post("/binary", headers={"Idempotency-Key": key}, content=b"x")
    second = client.post("/binary", headers={"Idempotency-Key": key}, content=b"x")
    assert first.status_code == second.status_code == 200
    assert second.content == first.content == bytes(range(256)) + b"\x00\xff"
    assert second.headers["Idempotent-Replayed"] == "true"


def test_the_body_bytes_are_fingerprinted_not_its_json_value(client: httpx.Client,
                                                             key: str) -> None:
    """docs/http.md: the exact bytes, never a parsed and re-serialised value; a U+0000 escape
    is bytes like any other (no 400)."""
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    sent = b'{"customer": "ada", "total": 42, "note": "a\\u0000b"}'
    first = client.post("/orders", headers=headers, content=sent)
    assert first.status_code == 201
    same = client.post("/orders", headers=headers, content=sent)
    assert same.status_code == 201 and same.headers["Idempotent-Replayed"] == "true"
    for other in (b'{"customer":"ada","total":42,"note":"a\\u0000b"}',
                  b'{"total": 42, "customer": "ada", "note": "a\\u0000b"}',
                  b'{"customer": "ada", "total": 42.0, "note": "a\\u0000b"}'):
        changed = client.post("/orders", headers=headers, content=other)
        assert changed.status_code == 422, other
        assert changed.headers["Content-Type"] == "application/problem+json"
        assert changed.json() == {"type": "about:blank", "title": "Unprocessable Entity",
                                  "status": 422, "code": "idempotency_key_mismatch",
                                  "detail": changed.json()["detail"]}


def test_scope_is_the_route_and_the_path_is_fingerprinted(client: httpx.Client, framework: str,
                                                          conn: psycopg.Connection[Any],
                                                          key: str) -> None:
    for body in ({"n": 1}, b"plain"):
        sent = {"json": body} if isinstance(body, dict) else {"content": body}
        k = f"{key}-{type(body).__name__}"
        first = client.post("/items/1", headers={"Idempotency-Key": k}, **sent)
        assert first.status_code == 200 and first.text == "1"
        again = client.post("/items/1", headers={"Idempotency-Key": k}, **sent)
        assert again.headers["Idempotent-Replayed"] == "true" and again.text == "1"
        other = client.post("/items/2", headers={"Idempotency-Key": k}, **sent)
        assert other.status_code == 422
    scopes = {r[0] for r in conn.execute("SELECT scope FROM idem_keys WHERE key LIKE %s",
                                         (key + "-%",))}
    route = "/items/<item>" if framework == "flask" else "/items/{item}"
    assert scopes == {http_scope("POST", route, caller="alice")}


def test_the_raw_target_with_its_query_is_fingerprinted(app: App, key: str) -> None:
    """Defect of issue 20: the fingerprint took the decoded path without the query string, so
    /items/1?x=1 then ?x=2 (or /items/%31 then /items/1) replayed the first answer."""
    def post(target: str) -> rawhttp.Answer:
        return rawhttp.send(app.port, "POST", target, [("Idempotency-Key", key), *ALICE.items()],
                            b"{}")

    first = post("/items/1?x=1")
    assert first.status == 200 and first.body == b"1"
    assert post("/items/1?x=1").header("Idempotent-Replayed") == "true"
    for other in ("/items/1?x=2", "/items/1", "/items/%31?x=1"):
        answer = post(other)
        assert answer.status == 422, other
        assert json.loads(answer.body)["code"] == "idempotency_key_mismatch"


def test_bad_or_missing_key_is_400_before_the_database(client: httpx.Client,
                                                       conn: psycopg.Connection[Any]) -> None:
    before = count(conn, "SELECT count(*) FROM idem_keys")
    missing = client.post("/orders", json=ORDER)
    assert missing.status_code == 400
    assert missing.headers["Content-Type"] == "application/problem+json"
    assert missing.json()["code"] == "idempotency_key_missing"
    for bad in ("", "x" * 256, "tab\there", "a b", '"open', '"a"b', '"a\\nb"', "a,b"):
        response = client.post("/orders", headers={"Idempotency-Key": bad}, json=ORDER)
        assert response.status_code == 400, bad
        assert response.json()["code"] == "idempotency_key_invalid"
    assert count(conn, "SELECT count(*) FROM idem_keys") == before


def test_a_repeated_key_header_is_400(app: App, conn: psycopg.Connection[Any],
                                      key: str) -> None:
    """Defect of issue 20: werkzeug joined two Idempotency-Key lines into "a,b", which was
    accepted as one key."""
    for lines in ([key, key + "-b"], [key, key], [f'"{key}"', f'"{key}-b"']):
        answer = rawhttp.send(app.port, "POST", "/orders",
                              [("Idempotency-Key", line) for line in lines]
                              + [("Content-Type", "application/json"), *ALICE.items()], json.dumps(ORDER).encode())
        assert answer.status == 400, lines
        assert answer.header("Content-Type") == "application/problem+json"
        assert json.loads(answer.body)["code"] == "idempotency_key_invalid"
    assert conn.execute("SELECT count(*) FROM idem_keys WHERE key LIKE %s",
                        (key + "%",)).fetchone() == (0,)
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key LIKE %s", key + "%") == 0


def test_a_quoted_key_is_the_same_key_as_its_bare_form(app: App, conn: psycopg.Connection[Any],
                                                       key: str) -> None:
    def post(value: str) -> rawhttp.Answer:
        return rawhttp.send(app.port, "POST", "/orders",
                            [("Idempotency-Key", value), ("Content-Type", "application/json"),
                             *ALICE.items()],
                            json.dumps(ORDER).encode())

    assert post(f'"{key}"').status == 201
    again = post(f"  {key}\t")
    assert again.status == 201 and again.header("Idempotent-Replayed") == "true"
    assert key_row(conn, key) is not None


def test_optional_key_runs_without_idempotency(client: httpx.Client) -> None:
    assert client.post("/binary", content=b"x").status_code == 200
    assert "Idempotent-Replayed" not in client.post("/binary", content=b"x").headers


def test_the_tenant_comes_from_the_user_never_a_header(client: httpx.Client,
                                                       conn: psycopg.Connection[Any],
                                                       key: str) -> None:
    """The application names the tenant from its own records of the authenticated user: an
    X-Tenant header the client sends changes nothing."""
    for user in (CAROL, ALICE):
        response = client.post("/orders", json=ORDER,
                               headers={"Idempotency-Key": key, "X-Tenant": "globex", **user})
        assert response.status_code == 201 and "Idempotent-Replayed" not in response.headers
    scopes = {r[0] for r in conn.execute("SELECT scope FROM idem_keys WHERE key = %s", (key,))}
    assert scopes == {http_scope("POST", "/orders", "acme", "carol"),
                      http_scope("POST", "/orders", None, "alice")}


# ---- callers ------------------------------------------------------------------------------

def test_two_callers_with_one_key_never_see_each_others_answer(
        client: httpx.Client, conn: psycopg.Connection[Any], key: str) -> None:
    """Bob sends the key Alice used (a guess, a log line, a counter starting at 1): he gets a
    run of his own, never Alice's stored answer and never a 422 telling him the key exists."""
    def post(user: dict[str, str], k: str, body: Any) -> httpx.Response:
        return client.post("/cached", headers={"Idempotency-Key": k, **user}, json=body)

    for k, bobs_body in ((key, {"a": 1}), (key + "-other-body", {"a": 2})):
        alice = post(ALICE, k, {"a": 1})
        assert alice.status_code == 201 and alice.json()["user"] == "alice"
        bob = post(BOB, k, bobs_body)
        assert bob.status_code == 201, bob.text
        assert "Idempotent-Replayed" not in bob.headers and bob.json()["user"] == "bob"
        for user, body, first in ((BOB, bobs_body, bob), (ALICE, {"a": 1}, alice)):
            replay = post(user, k, body)
            assert replay.headers["Idempotent-Replayed"] == "true"
            assert replay.content == first.content
            assert replay.headers["Cache-Control"] == "no-store"
        scopes = {r[0] for r in conn.execute("SELECT scope FROM idem_keys WHERE key = %s",
                                             (k,))}
        assert scopes == {http_scope("POST", "/cached", None, user)
                          for user in ("alice", "bob")}


def test_a_keyed_request_without_a_caller_is_401_before_the_database(
        client: httpx.Client, conn: psycopg.Connection[Any], key: str) -> None:
    before = count(conn, "SELECT count(*) FROM idem_keys")
    for auth in ({}, {"Authorization": ""}, {"Authorization": "Bearer forged"}):
        response = client.post("/orders", json=ORDER,
                               headers={"Idempotency-Key": key, "Authorization": "", **auth}
                               if not auth else {"Idempotency-Key": key, **auth})
        assert response.status_code == 401, auth
        assert response.headers["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "idempotency_caller_unknown"
    assert count(conn, "SELECT count(*) FROM idem_keys") == before
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 0
    # without a key the caller is not asked: the optional route runs
    assert client.post("/binary", content=b"x", headers={"Authorization": ""}).status_code == 200


def test_a_public_route_shares_its_keys(client: httpx.Client, key: str) -> None:
    first = client.post("/webhook", headers={"Idempotency-Key": key, **ALICE}, json={"e": 1})
    assert first.status_code == 201
    for other in (BOB, {"Authorization": ""}):
        again = client.post("/webhook", headers={"Idempotency-Key": key, **other}, json={"e": 1})
        assert again.headers["Idempotent-Replayed"] == "true" and again.content == first.content


def test_routes_must_say_who_the_caller_is() -> None:
    """Neither caller nor public, or both, is a TypeError when the route is decorated."""
    from flask import Flask  # noqa: F401  (the integration imports it)
    from pg_idempotency import AsyncIdempotency, Idempotency
    from pg_idempotency.fastapi import FastAPIIdempotency
    from pg_idempotency.flask import FlaskIdempotency

    for integration, client in ((FlaskIdempotency, Idempotency), (FastAPIIdempotency,
                                                                  AsyncIdempotency)):
        idem = integration(client(None))  # type: ignore[arg-type]
        for decorator in (idem.transactional, idem.leased):
            with pytest.raises(TypeError, match=r"say who the caller is: caller=lambda request"
                               r": request\.user\.id .* or public=True"):
                decorator()(lambda: None)
            with pytest.raises(TypeError, match="not both"):
                decorator(caller=lambda request: "u", public=True)
            decorator(public=True)(lambda: None)
            decorator(caller=lambda request: "u")(lambda: None)
        with pytest.raises(TypeError, match="not both"):
            integration(client(None), caller=lambda request: "u", public=True)


# ---- bodies -------------------------------------------------------------------------------

def answer_without_sending_the_body(port: int, head: list[bytes], sent: bytes) -> rawhttp.Answer:
    """Send the head and part of a body, never the rest, and read the answer: a server that
    waited for the whole body would never answer (the socket's timeout fails the test)."""
    import http.client
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + sent)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        return rawhttp.Answer(response.status, response.getheaders(), response.read())


def test_a_body_over_the_limit_is_413_and_never_read_to_its_end(app: App, key: str,
                                                                conn: psycopg.Connection[Any]
                                                                ) -> None:
    head = [b"POST /small HTTP/1.1", b"Host: 127.0.0.1", b"Idempotency-Key: " + key.encode(),
            b"Authorization: " + ALICE["Authorization"].encode(),
            b"Content-Type: application/octet-stream"]
    # a GiB announced, nothing sent: answered from the Content-Length alone
    declared = answer_without_sending_the_body(app.port, head + [b"Content-Length: 1073741824"],
                                                b"")
    # chunked, 4 KiB sent and the body never ended: reading stops past the route's 1 KiB
    chunk = b"x" * 512
    streamed = answer_without_sending_the_body(
        app.port, head + [b"Transfer-Encoding: chunked"], b"200\r\n" + chunk + b"\r\n" * 1
        + (b"200\r\n" + chunk + b"\r\n") * 7)
    for answer in (declared, streamed):
        assert answer.status == 413, answer
        assert json.loads(answer.body)["code"] == "idempotency_body_too_large"
    assert key_row(conn, key) is None
    # at the limit: read, claimed and answered
    exact = rawhttp.send(app.port, "POST", "/small", [("Idempotency-Key", key), *ALICE.items()],
                         b"y" * 1024)
    assert exact.status == 201 and exact.body == b"1024"


def test_an_unkeyed_request_is_not_read_by_the_library(app: App) -> None:
    """No key on an optional route whose view does not read the body: a GiB is announced and
    none of it sent, and the view's answer comes all the same (a library that read the body
    first would wait for it forever)."""
    head = [b"POST /things HTTP/1.1", b"Host: 127.0.0.1", b"Content-Length: 1073741824",
            b"Authorization: " + ALICE["Authorization"].encode(),
            b"Content-Type: application/octet-stream"]
    answer = answer_without_sending_the_body(app.port, head, b"")
    assert answer.status == 201 and json.loads(answer.body)["user"] == "alice"
    assert answer.header("Idempotent-Replayed") is None


def test_an_unkeyed_body_is_left_to_the_application(client: httpx.Client) -> None:
    """No key on an optional route: the library reads nothing, so its limit does not apply and
    the view reads the whole body itself."""
    body = b"z" * (300 * 1024)
    for chunked in (False, True):
        sent = iter([body]) if chunked else body  # an iterator: httpx sends it chunked
        response = client.post("/sized", content=sent)
        assert response.status_code == 201 and response.text == str(len(body)), chunked


# ---- repeated headers ---------------------------------------------------------------------

def test_a_repeated_fingerprint_header_is_one_value(app: App, framework: str, key: str) -> None:
    """ASGI gives the field lines: they are joined with ", " (docs/http.md). A WSGI server
    joins them itself with "," into one value, and the lines cannot be told from that one
    line (README "Repeated headers")."""
    def post(*values: str) -> rawhttp.Answer:
        return rawhttp.send(app.port, "POST", "/accounts",
                            [("Idempotency-Key", key), *ALICE.items(),
                             *(("X-Account", value) for value in values)], b"{}")

    first = post("a", "b")
    assert first.status == 201
    same, other = ("a,b", "a, b") if framework == "flask" else ("a, b", "a,b")
    replay = post(same)
    assert replay.header("Idempotent-Replayed") == "true" and replay.body == first.body
    assert post(other).status == 422
    assert post("b", "a").status == 422


def test_a_repeated_content_type(app: App, framework: str, key: str) -> None:
    """ASGI: the lines joined with ", "; werkzeug keeps the last line of a repeated
    Content-Type (README "Repeated headers")."""
    def post(*values: str) -> rawhttp.Answer:
        return rawhttp.send(app.port, "POST", "/things",
                            [("Idempotency-Key", key), *ALICE.items(),
                             *(("Content-Type", value) for value in values)], b"{}")

    first = post("text/plain", "application/json")
    assert first.status == 201
    same, other = (("application/json",), ("text/plain, application/json",)) \
        if framework == "flask" else (("text/plain, application/json",), ("application/json",))
    replay = post(*same)
    assert replay.header("Idempotent-Replayed") == "true" and replay.body == first.body
    assert post(*other).status == 422


# ---- failures by policy -------------------------------------------------------------------

def test_retryable_failure_runs_again_and_terminal_failure_replays(
        client: httpx.Client, conn: psycopg.Connection[Any], key: str) -> None:
    headers = {"Idempotency-Key": key}
    assert client.post("/payments", headers={**headers, "X-Status": "503"},
                       json={"amount": 1}).status_code == 503
    assert key_row(conn, key) == ("failed", 1, True, 503)
    ok = client.post("/payments", headers=headers, json={"amount": 1})
    assert ok.status_code == 201 and ok.json()["attempt"] == 2

    other = "k-" + uuid.uuid4().hex
    headers = {"Idempotency-Key": other}
    declined = client.post("/payments", headers={**headers, "X-Status": "402"},
                           json={"amount": 1})
    assert declined.status_code == 402
    again = client.post("/payments", headers={**headers, "X-Status": "201"},
                        json={"amount": 1})
    assert again.status_code == 402 and again.headers["Idempotent-Replayed"] == "true"
    assert again.content == declined.content
    assert count(conn, "SELECT count(*) FROM handler_runs WHERE idem_key = %s", other) == 1


@pytest.mark.parametrize("framework", ["flask"], indirect=True)  # a before_request hook
def test_a_body_a_parser_consumed_is_refused_not_guessed(
        client: httpx.Client, conn: psycopg.Connection[Any], key: str) -> None:
    answer = client.post("/form-first", headers={"Idempotency-Key": key},
                         data={"a": "1", "b": "2"})
    assert answer.status_code == 500
    assert answer.json()["code"] == "idempotency_raw_body_unavailable"
    assert key_row(conn, key) is None


def test_425_is_retryable(client: httpx.Client, conn: psycopg.Connection[Any],
                          key: str) -> None:
    """Defect of issue 20: 425 Too Early was stored as a final failure and replayed."""
    headers = {"Idempotency-Key": key}
    too_early = client.post("/payments", headers={**headers, "X-Status": "425"}, json={})
    assert too_early.status_code == 425
    assert key_row(conn, key) == ("failed", 1, True, 425)
    ok = client.post("/payments", headers=headers, json={})
    assert ok.status_code == 201 and "Idempotent-Replayed" not in ok.headers
    assert ok.json()["attempt"] == 2
    # same-transaction mode: nothing is stored, the order is rolled back
    other = key + "-tx"
    assert post_order(client, other, status="425").status_code == 425
    assert key_row(conn, other) is None
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", other) == 0
    assert post_order(client, other).status_code == 201


def test_a_stored_error_answer_rolls_back_the_handlers_writes(
        client: httpx.Client, conn: psycopg.Connection[Any], key: str) -> None:
    """Defect of issue 20: a same-transaction handler that wrote and answered 409 committed its
    write behind the stored failure."""
    conflict = post_order(client, key, status="409")
    assert conflict.status_code == 409
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 0
    assert count(conn, "SELECT count(*) FROM handler_runs WHERE idem_key = %s", key) == 0
    assert key_row(conn, key) == ("failed", 1, False, 409)
    again = post_order(client, key)
    assert again.status_code == 409 and again.headers["Idempotent-Replayed"] == "true"
    assert again.content == conflict.content
    # keep_writes_on_error: the route keeps them
    kept = client.post("/keep", headers={"Idempotency-Key": key}, json={})
    assert kept.status_code == 409
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 1


def test_validate_answers_before_the_claim_and_on_committed_after_the_commit(
        client: httpx.Client, conn: psycopg.Connection[Any], framework: str, key: str) -> None:
    headers = {"Idempotency-Key": key}
    refused = client.post("/validated", headers=headers, json={"total": 1})
    assert refused.status_code == 400 and refused.json() == {"invalid": True}
    assert key_row(conn, key) is None  # nothing stored: the key stays free
    done = client.post("/validated", headers=headers, json={"customer": "ada"})
    assert done.status_code == 201 and "Idempotent-Replayed" not in done.headers
    # the handler's context: key, scope and attempt
    assert done.json() == {"key": key, "scope": http_scope("POST", "/validated", caller="alice"),
                           "attempt": 1,
                           "inserted": True}
    # the hook ran after the commit: another session saw the stored result
    assert done.headers["X-Committed-State"] == "succeeded"
    replay = client.post("/validated", headers=headers, json={"customer": "ada"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert "X-Committed-State" not in replay.headers  # not on a replay: nothing committed
    # a failing hook is logged: the answer and the stored result stand
    other = key + "-hook"
    failed_hook = client.post("/validated", headers={"Idempotency-Key": other,
                                                     "X-Fail-Hook": "1"}, json={"customer": "b"})
    assert failed_hook.status_code == 201
    assert key_row(conn, other) == ("succeeded", 1, None, 201)


def test_framework_http_exception_is_an_answer(client: httpx.Client,
                                               conn: psycopg.Connection[Any], key: str) -> None:
    headers = {"Idempotency-Key": key}
    aborted = client.post("/payments", headers={**headers, "X-Abort": "404"}, json={})
    assert aborted.status_code == 404
    assert key_row(conn, key) == ("failed", 1, False, 404)
    again = client.post("/payments", headers=headers, json={})
    assert again.status_code == 404 and again.headers["Idempotent-Replayed"] == "true"
    assert again.content == aborted.content


def test_handler_exception_is_a_retryable_failure(client: httpx.Client,
                                                  conn: psycopg.Connection[Any],
                                                  key: str) -> None:
    response = client.post("/raise", headers={"Idempotency-Key": key}, json={})
    assert response.status_code == 500
    assert key_row(conn, key) == ("failed", 1, True, 500)


# ---- concurrency --------------------------------------------------------------------------

def concurrently(app: App, send: Any) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=120, limits=limits) as c, \
            ThreadPoolExecutor(64) as pool:
        return list(pool.map(lambda _: send(c), range(64)))


@pytest.mark.newest
def test_64_concurrent_identical_orders_run_once(app: App, conn: psycopg.Connection[Any],
                                                 key: str) -> None:
    responses = concurrently(app, lambda c: post_order(c, key, pause="0.5"))
    fresh = [r for r in responses if r.status_code == 201
             and "Idempotent-Replayed" not in r.headers]
    replays = [r for r in responses if r.headers.get("Idempotent-Replayed") == "true"]
    busy = [r for r in responses if r.status_code == 409]
    assert len(fresh) == 1 and len(fresh) + len(replays) + len(busy) == 64
    assert all(r.content == fresh[0].content for r in replays)
    assert count(conn, "SELECT count(*) FROM handler_runs WHERE idem_key = %s", key) == 1
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 1


@pytest.mark.newest
def test_64_concurrent_identical_payments_run_once(app: App, markers: Path,
                                                   conn: psycopg.Connection[Any],
                                                   key: str) -> None:
    # the winner's handler is held (under a minute's lease) until the 63 others have their
    # answers: each came during the lease and the handler, so each is 409
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=180, limits=limits) as c, \
            ThreadPoolExecutor(64) as pool:
        sent = [pool.submit(lambda: c.post("/payments-held", headers={"Idempotency-Key": key},
                                           json={"amount": 5})) for _ in range(64)]
        wait_for(markers / f"{key}.1")
        deadline = time.monotonic() + 120
        while sum(f.done() for f in sent) < 63:
            assert time.monotonic() < deadline, "the duplicates were never answered"
            time.sleep(0.05)
        (markers / f"{key}.1.release").touch()
        responses = [f.result() for f in sent]
    fresh = [r for r in responses if r.status_code == 201
             and "Idempotent-Replayed" not in r.headers]
    busy = [r for r in responses if r.status_code == 409]
    assert len(fresh) == 1 and len(busy) == 63
    for r in busy:
        assert r.json()["code"] == "idempotency_key_in_progress"
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert count(conn, "SELECT count(*) FROM handler_runs WHERE idem_key = %s", key) == 1


# ---- crashes and takeovers ----------------------------------------------------------------

@pytest.mark.newest
def test_kill9_during_same_transaction_handler(framework: str, dsn: str, markers: Path, app: App,
                                               conn: psycopg.Connection[Any], key: str) -> None:
    doomed = App(framework, dsn, markers)
    try:
        sent = threading.Thread(target=lambda: _ignore_errors(
            lambda: post_order(httpx.Client(headers=ALICE, base_url=doomed.url, timeout=60), key, pause="60")))
        sent.start()
        wait_for(markers / key)
        doomed.kill()
        sent.join()
    finally:
        doomed.stop()
    # the order and the key were written in the open transaction: both vanish with it
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 0
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=60) as c:  # the retry reaches another instance
        retry = post_order(c, key)
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
        assert post_order(c, key).headers["Idempotent-Replayed"] == "true"
    assert count(conn, "SELECT count(*) FROM orders WHERE idem_key = %s", key) == 1
    assert key_row(conn, key) == ("succeeded", 1, None, 201)


@pytest.mark.newest
def test_kill9_during_leased_handler(framework: str, dsn: str, markers: Path, app: App,
                                     conn: psycopg.Connection[Any], key: str) -> None:
    doomed = App(framework, dsn, markers)
    try:
        sent = threading.Thread(target=lambda: _ignore_errors(lambda: httpx.Client(
            headers=ALICE, base_url=doomed.url, timeout=60).post("/payments",
                                                  headers={"Idempotency-Key": key,
                                                           "X-Pause": "60"},
                                                  json={"amount": 7})))
        sent.start()
        wait_for(markers / f"{key}.1")
        doomed.kill()
        sent.join()
    finally:
        doomed.stop()
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=60) as c:
        def retry() -> httpx.Response:
            return c.post("/payments", headers={"Idempotency-Key": key}, json={"amount": 7})
        response = retry()
        while response.status_code == 409:  # the dead worker's lease (2 s) still runs
            time.sleep(int(response.headers["Retry-After"]))
            response = retry()
        assert response.status_code == 201 and response.json()["attempt"] == 2
    assert key_row(conn, key) == ("succeeded", 2, None, 201)
    assert conn.execute("SELECT attempt FROM provider_charges WHERE provider_key = %s",
                        (key,)).fetchall() == [(2,)]


@pytest.mark.newest
def test_stale_worker_completion_is_rejected(app: App, markers: Path,
                                             conn: psycopg.Connection[Any], key: str) -> None:
    stale: list[httpx.Response] = []

    def slow() -> None:
        with httpx.Client(headers=ALICE, base_url=app.url, timeout=180) as c:
            stale.append(c.post("/payments", headers={"Idempotency-Key": key, "X-Hold": "1"},
                                json={"amount": 9}))

    worker = threading.Thread(target=slow)
    worker.start()
    wait_for(markers / f"{key}.1")
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=60) as c:
        def retry() -> httpx.Response:
            return c.post("/payments", headers={"Idempotency-Key": key}, json={"amount": 9})
        response = retry()
        while response.status_code == 409:  # the held worker's lease (2 s) still runs
            time.sleep(int(response.headers["Retry-After"]))
            response = retry()
    assert response.status_code == 201 and response.json()["attempt"] == 2
    (markers / f"{key}.1.release").touch()  # the stale worker finishes only now
    worker.join()
    assert stale[0].status_code == 409  # never a 2xx: attempt 2 owns the key
    assert stale[0].json()["code"] == "idempotency_attempt_stale"
    assert key_row(conn, key) == ("succeeded", 2, None, 201)
    # both attempts called the provider with the same key; the provider kept one charge
    assert count(conn, "SELECT count(*) FROM provider_charges WHERE provider_key = %s",
                 key) == 1


def _ignore_errors(call: Any) -> None:
    try:
        call()
    except httpx.TransportError:
        pass  # the application was killed under this request


# ---- version 1.2 --------------------------------------------------------------------------

@pytest.mark.versions("1.2")
def test_heartbeat_keeps_a_long_job_alive(app: App, markers: Path,
                                          conn: psycopg.Connection[Any], key: str) -> None:
    done: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: done.append(httpx.post(
        app.url + "/heartbeat", headers={"Idempotency-Key": key, "X-Hold": "1", **ALICE},
        json={}, timeout=180)))
    worker.start()
    wait_for(markers / f"{key}.1")
    claimed_until = conn.execute("SELECT locked_until FROM idem_keys WHERE key = %s",
                                 (key,)).fetchone()
    assert claimed_until is not None
    # the job runs past the 3 s lease it claimed (the server's clock says when), and the
    # heartbeat (every second) has moved the lease on: a duplicate is still 409
    deadline = time.monotonic() + 60
    while conn.execute("SELECT clock_timestamp() > %s"
                       " AND locked_until > clock_timestamp() + interval '1 s'"
                       " FROM idem_keys WHERE key = %s",
                       (claimed_until[0], key)).fetchone() != (True,):
        assert time.monotonic() < deadline, "the lease was never extended past its first end"
        time.sleep(0.05)
    with httpx.Client(headers=ALICE, base_url=app.url, timeout=60) as c:
        response = c.post("/heartbeat", headers={"Idempotency-Key": key}, json={})
        assert response.status_code == 409, response.text
        assert response.json()["code"] == "idempotency_key_in_progress"
    (markers / f"{key}.1.release").touch()
    worker.join()
    assert done[0].status_code == 200 and done[0].json()["attempt"] == 1
    assert key_row(conn, key) == ("succeeded", 1, None, 200)


@pytest.mark.versions("1.2")
def test_a_lost_lease_is_409_and_its_result_is_not_stored(app: App, markers: Path,
                                                          conn: psycopg.Connection[Any],
                                                          key: str) -> None:
    """A heartbeat that finds the key gone (forgotten here; taken over alike) tells the handler
    (lease.lost), and the answer is 409 idempotency_attempt_stale."""
    done: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: done.append(httpx.post(
        app.url + "/heartbeat", headers={"Idempotency-Key": key, "X-Until-Lost": "1", **ALICE},
        json={}, timeout=120)))
    worker.start()
    wait_for(markers / f"{key}.1")
    assert conn.execute("SELECT idem_forget(%s, scope => %s, force => true)",
                        (key, http_scope("POST", "/heartbeat", caller="alice"))
                        ).fetchone() == (True,)
    worker.join()
    assert done[0].status_code == 409
    assert done[0].json()["code"] == "idempotency_attempt_stale"
    assert key_row(conn, key) is None


@pytest.mark.versions("1.1")
def test_heartbeats_on_1_1(app: App, conn: psycopg.Connection[Any], key: str) -> None:
    """By default a route runs without them (1.1 has no idem_extend); one that requires them
    fails before claiming. (A connection each: a server may close one after a 500.)"""
    response = httpx.post(app.url + "/heartbeat-required", headers={"Idempotency-Key": key, **ALICE},
                          json={}, timeout=60)
    assert response.status_code == 500
    assert key_row(conn, key) is None
    response = httpx.post(app.url + "/heartbeat", headers={"Idempotency-Key": key, **ALICE,
                                                           "X-Pause": "0"}, json={}, timeout=60)
    assert response.status_code == 200 and key_row(conn, key) == ("succeeded", 1, None, 200)


@pytest.mark.versions("1.2")
def test_replay_uses_the_body_and_headers_columns(client: httpx.Client,
                                                  conn: psycopg.Connection[Any],
                                                  key: str) -> None:
    first = post_order(client, key)
    row = conn.execute("SELECT response, response_body, response_headers FROM idem_keys"
                       " WHERE key = %s", (key,)).fetchone()
    assert row is not None and row[0] is None and bytes(row[1]) == first.content
    assert row[2] == {"Content-Type": "application/json",
                      "Location": first.headers["Location"]}
