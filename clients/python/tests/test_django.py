"""The Django integration through Django's test client, against the real extension."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any, Iterator

import django
import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import clear_url_caches, path
from django.utils.asyncio import async_unsafe
from psycopg_pool import ConnectionPool

if not settings.configured:
    settings.configure(DEBUG=False, ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__,
                       DATABASES={}, MIDDLEWARE=[], SECRET_KEY="tests-only",
                       USE_TZ=True, LOGGING_CONFIG=None)
    django.setup()

from pg_idempotency import Idempotency  # noqa: E402
from pg_idempotency.django import DjangoIdempotency  # noqa: E402
from pg_idempotency.http import http_scope  # noqa: E402

#: the bearer tokens the test views accept, and the user each names
USERS = {"Bearer token-alice": "alice", "Bearer token-bob": "bob"}

#: set by the fixture: the views are built for each extension version's pool
urlpatterns: list[Any] = []


@pytest.fixture
def client(pool: ConnectionPool) -> Iterator[Client]:
    idem = DjangoIdempotency(Idempotency(pool),
                             caller=lambda request: USERS.get(request.headers.get("Authorization")))

    @idem.transactional(required=True)
    def create_order(request: HttpRequest, shop: int, conn: psycopg.Connection[Any]) -> Any:
        order = json.loads(request.body)
        if order.get("missing"):
            raise Http404("no such product")
        if order.get("crash"):
            conn.execute("INSERT INTO orders (customer, total, idem_key) VALUES ('crash', 0, %s)",
                         (request.headers["Idempotency-Key"],))
            raise RuntimeError("the handler failed")
        (order_id,) = conn.execute(
            "INSERT INTO orders (customer, total, idem_key) VALUES (%s, %s, %s) RETURNING id",
            (order["customer"], order["total"], request.headers["Idempotency-Key"])).fetchone()
        # key order and spacing that jsonb would not keep: the replay must be byte-exact
        response = HttpResponse(f'{{"z": 1,  "order_id": {order_id}, "token": "{uuid.uuid4()}"}}',
                                content_type="application/json", status=201)
        response["Location"] = f"/shops/{shop}/orders/{order_id}"
        return response

    @idem.leased(required=True, lease=timedelta(seconds=30))
    def pay(request: HttpRequest, lease: Any) -> Any:
        return JsonResponse({"provider_key": lease.key, "attempt": lease.attempt,
                             "token": str(uuid.uuid4())}, status=201)

    # a hook that, like request.user's first load, refuses to run on an event loop
    @idem.leased(required=True,
                 caller=async_unsafe(lambda request: USERS.get(request.headers.get(
                     "Authorization"))))
    async def pay_async(request: HttpRequest, lease: Any) -> Any:
        await asyncio.sleep(0)  # a coroutine all the way: awaited by the integration
        return JsonResponse({"provider_key": lease.key, "attempt": lease.attempt,
                             "token": str(uuid.uuid4())}, status=201)

    @idem.transactional(required=True)
    async def order_async(request: HttpRequest, conn: psycopg.Connection[Any]) -> Any:
        order = json.loads(request.body)
        row = await sync_to_async(lambda: conn.execute(
            "INSERT INTO orders (customer, total, idem_key) VALUES (%s, %s, %s) RETURNING id",
            (order["customer"], order["total"], request.idempotency.key)).fetchone())()
        return JsonResponse({"order_id": row[0], "token": str(uuid.uuid4())}, status=201)

    async def refuse_empty(request: HttpRequest) -> Any:
        await asyncio.sleep(0)
        return None if json.loads(request.body) else JsonResponse({"empty": True}, status=400)

    async def committed(context: Any, response: Any) -> None:
        await asyncio.sleep(0)
        response["X-Committed-Key"] = context.key

    @idem.leased(required=True, validate=refuse_empty, on_committed=committed)
    async def hooked_async(request: HttpRequest, lease: Any) -> Any:
        return JsonResponse({"attempt": lease.attempt}, status=201)

    urlpatterns[:] = [path("shops/<int:shop>/orders", create_order), path("payments", pay),
                      path("async/payments", pay_async), path("async/orders", order_async),
                      path("async/hooked", hooked_async)]
    clear_url_caches()
    yield Client(raise_request_exception=False, HTTP_AUTHORIZATION="Bearer token-alice")
    urlpatterns.clear()
    clear_url_caches()


def post(client: Client, url: str, body: Any, key: Any = None, raw: Any = None) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(url, data=raw if raw is not None else json.dumps(body),
                       content_type="application/json", **headers)


def orders(pool: ConnectionPool, key: str) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (key,)).fetchone()
    assert row is not None
    return int(row[0])


def test_transactional_runs_once_and_replays_byte_for_byte(client: Client, pool: ConnectionPool,
                                                            key: str) -> None:
    first = post(client, "/shops/7/orders", {"customer": "ada", "total": 5}, key)
    assert first.status_code == 201, first.content
    assert first.has_header("Idempotent-Replayed") is False
    # the body's bytes are fingerprinted (docs/http.md): the same members in another order are
    # another request
    reordered = post(client, "/shops/7/orders", {"total": 5, "customer": "ada"}, key)
    assert reordered.status_code == 422
    again = post(client, "/shops/7/orders", {"customer": "ada", "total": 5}, key)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again["Content-Type"] == "application/json"
    assert again["Location"] == first["Location"]
    assert orders(pool, key) == 1
    # the scope is the route pattern: the same key on another shop is another request
    other = post(client, "/shops/8/orders", {"customer": "ada", "total": 5}, key)
    assert other.status_code == 422


def test_changed_body_bad_or_missing_key(client: Client, pool: ConnectionPool, key: str) -> None:
    assert post(client, "/shops/1/orders", {"customer": "a", "total": 1}, key).status_code == 201
    changed = post(client, "/shops/1/orders", {"customer": "a", "total": 2}, key)
    assert changed.status_code == 422
    assert changed["Content-Type"] == "application/problem+json"
    assert json.loads(changed.content)["code"] == "idempotency_key_mismatch"
    assert post(client, "/shops/1/orders", {"customer": "a", "total": 1}).status_code == 400
    for bad in ("", "x" * 256, "tab\there"):
        assert post(client, "/shops/1/orders", {"customer": "a", "total": 1}, bad).status_code \
            == 400, repr(bad)
    # a \u0000 escape is body bytes like any other (docs/http.md): no 400
    nul = post(client, "/shops/1/orders", None, "nul-" + key,
               raw='{"customer": "a", "total": 1, "note": "\\u0000"}')
    assert nul.status_code == 201
    assert orders(pool, key) == 1


def test_a_failing_view_rolls_back_and_404_is_stored(client: Client, pool: ConnectionPool,
                                                      key: str) -> None:
    crash = post(client, "/shops/1/orders", {"crash": True}, key)
    assert crash.status_code == 500
    assert orders(pool, key) == 0, "the view's write rolled back with the key"
    retry = post(client, "/shops/1/orders", {"crash": True}, key)
    assert retry.status_code == 500 and not retry.has_header("Idempotent-Replayed")
    missing = "missing-" + key
    first = post(client, "/shops/1/orders", {"missing": True}, missing)
    assert first.status_code == 404
    replay = post(client, "/shops/1/orders", {"missing": True}, missing)
    assert replay.status_code == 404
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content


def test_leased_view_gets_the_key_and_replays(client: Client, key: str) -> None:
    first = post(client, "/payments", {"amount": 3}, key)
    assert first.status_code == 201
    body = json.loads(first.content)
    assert body["provider_key"] == key and body["attempt"] == 1
    again = post(client, "/payments", {"amount": 3}, key)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


def test_async_views_run_once_and_replay(client: Client, pool: ConnectionPool,
                                         key: str) -> None:
    """An ``async def`` view under the decorator (here through Django's sync handler; under
    ASGI and uvicorn in test_conformance.py)."""
    first = post(client, "/async/payments", {"amount": 3}, key)
    assert first.status_code == 201, first.content
    assert json.loads(first.content)["provider_key"] == key
    again = post(client, "/async/payments", {"amount": 3}, key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    order = post(client, "/async/orders", {"customer": "ada", "total": 2}, key)
    assert order.status_code == 201 and orders(pool, key) == 1
    replay = post(client, "/async/orders", {"customer": "ada", "total": 2}, key)
    assert replay["Idempotent-Replayed"] == "true" and replay.content == order.content
    assert orders(pool, key) == 1


def test_an_async_views_hooks_may_be_coroutines(client: Client, pool: ConnectionPool,
                                                key: str) -> None:
    refused = post(client, "/async/hooked", {}, key)
    assert refused.status_code == 400 and json.loads(refused.content) == {"empty": True}
    with pool.connection() as conn:  # validate answered before the claim: nothing stored
        assert conn.execute("SELECT count(*) FROM idem_keys WHERE key = %s",
                            (key,)).fetchone() == (0,)
    done = post(client, "/async/hooked", {"a": 1}, key)
    assert done.status_code == 201 and done["X-Committed-Key"] == key
    replay = post(client, "/async/hooked", {"a": 1}, key)
    assert replay["Idempotent-Replayed"] == "true" and not replay.has_header("X-Committed-Key")


def test_callers_scope_keys_and_an_unknown_caller_is_401(client: Client, pool: ConnectionPool,
                                                         key: str) -> None:
    alice = post(client, "/shops/1/orders", {"customer": "a", "total": 1}, key)
    bob = client.post("/shops/1/orders", data=json.dumps({"customer": "a", "total": 1}),
                      content_type="application/json", HTTP_IDEMPOTENCY_KEY=key,
                      HTTP_AUTHORIZATION="Bearer token-bob")
    assert alice.status_code == bob.status_code == 201
    assert not bob.has_header("Idempotent-Replayed") and bob.content != alice.content
    assert orders(pool, key) == 2
    with pool.connection() as conn:
        scopes = {r[0] for r in conn.execute("SELECT scope FROM idem_keys WHERE key = %s",
                                             (key,))}
    assert scopes == {http_scope("POST", "/shops/<int:shop>/orders", None, user)
                      for user in ("alice", "bob")}
    nobody = client.post("/shops/1/orders", data="{}", content_type="application/json",
                         HTTP_IDEMPOTENCY_KEY=key + "-nobody", HTTP_AUTHORIZATION="")
    assert nobody.status_code == 401
    assert json.loads(nobody.content)["code"] == "idempotency_caller_unknown"


def test_a_view_must_say_who_the_caller_is(pool: ConnectionPool) -> None:
    idem = DjangoIdempotency(Idempotency(pool))
    for decorator in (idem.transactional, idem.leased):
        with pytest.raises(TypeError, match="say who the caller is"):
            decorator()(lambda request: None)
        with pytest.raises(TypeError, match="not both"):
            decorator(caller=lambda request: "u", public=True)
        decorator(public=True)(lambda request: None)
    with pytest.raises(TypeError, match="not both"):
        DjangoIdempotency(Idempotency(pool), caller=lambda request: "u", public=True)
