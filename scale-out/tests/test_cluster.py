"""4 partitions + 1 proxy: the API through the proxy, routing, exactly-once under load, a
partition down, each partition's reaper."""

import json
import threading
import time

import psycopg
import pytest

from load import ClaimLog, join, response, rng, run_clients

PARTITION_OF = "SELECT idem_partition.idem_scope_partition(%s, %s)"


def owner(conn, scope, partitions=4):
    return conn.execute(PARTITION_OF, [scope, partitions]).fetchone()[0]


def rows_on(cluster, where="true", params=None):
    return cluster.query(f"SELECT scope, key, state, attempt, response, response_code FROM idem_keys WHERE {where}"
                         " ORDER BY scope, key", params)


def test_api_through_the_proxy_matches_the_partition(four):
    with four.proxy.connect() as px:
        p = four.partitions[owner(px, "acme")]
        claim = px.execute("SELECT * FROM idem_claim('order-1', '{\"sku\": \"A\"}', scope => 'acme',"
                           " lease => '1 hour')").fetchone()
        assert claim[:4] == ("claimed", True, 1, "pending")
        again = px.execute("SELECT outcome, attempt, retry_after > '0' FROM idem_claim('order-1',"
                           " '{\"sku\": \"A\"}', scope => 'acme')").fetchone()
        assert again == ("in_progress", 1, True)
        done = px.execute("SELECT * FROM idem_complete('order-1', '{\"order\": 7}', 201, scope => 'acme',"
                          " attempt => 1)").fetchone()
        assert (done[0], done[1], done[2], done[5], done[6]) == ("acme", "order-1", "succeeded", {"order": 7}, 201)
        replay = px.execute("SELECT outcome, inserted, response, response_code FROM idem_claim('order-1',"
                            " '{\"sku\": \"A\"}', scope => 'acme')").fetchone()
        assert replay == ("replay", False, {"order": 7}, 201)
        through = px.execute("SELECT * FROM idem_lookup('order-1', scope => 'acme')").fetchone()
        with p.connect() as direct:
            assert direct.execute("SELECT * FROM idem_lookup('order-1', scope => 'acme')").fetchone() == through
        assert px.execute("SELECT idem_lookup('nope', scope => 'acme') IS NULL").fetchone() == (True,)

        # fail, then a takeover of the retryable failure
        px.execute("SELECT idem_claim('pay-1', scope => 'acme')")
        failed = px.execute("SELECT state, retryable, response_code FROM idem_fail('pay-1', '{\"e\": 1}', 503,"
                            " scope => 'acme', attempt => 1)").fetchone()
        assert failed == ("failed", True, 503)
        assert px.execute("SELECT outcome, inserted, attempt FROM idem_claim('pay-1', scope => 'acme')"
                          ).fetchone() == ("claimed", False, 2)
        # the default scope '' routes like any other
        assert px.execute("SELECT outcome FROM idem_claim('no-scope')").fetchone() == ("claimed",)
        with four.partitions[owner(px, "")].connect() as direct:
            assert direct.execute("SELECT count(*) FROM idem_keys WHERE scope = '' AND key = 'no-scope'"
                                  ).fetchone() == (1,)


@pytest.mark.parametrize("sql, state", [
    ("SELECT idem_claim('order-1', '{\"sku\": \"B\"}', scope => 'acme')", "IK001"),
    ("SELECT idem_complete('pay-1', '{}', scope => 'acme', attempt => 1)", "IK002"),
    ("SELECT idem_complete('missing', '{}', scope => 'acme')", "IK003"),
    ("SELECT idem_complete('order-1', '{}', scope => 'acme')", "IK004"),
    ("SELECT idem_claim('k', scope => NULL)", "22004"),
    ("SELECT idem_claim(NULL, scope => 'acme')", "22004"),
    ("SELECT idem_claim(e'bad\\nkey', scope => 'acme')", "22023"),
    ("SELECT idem_claim('k', scope => 'acme', ttl => '-1 day')", "22023"),
    ("SELECT idem_lookup('k', scope => NULL)", "22004"),
    ("SELECT idem_partition_of(NULL)", "22004"),
])
def test_errors_keep_their_sqlstate_through_the_proxy(four, sql, state):
    with four.proxy.connect() as px:
        with pytest.raises(psycopg.Error) as error:
            px.execute(sql)
        assert error.value.sqlstate == state, str(error.value)


def test_keys_land_where_the_routing_says_spread_evenly(four):
    scopes = [f"tenant-{i}" for i in range(800)]
    with four.proxy.connect() as px:
        for scope in scopes:
            px.execute("SELECT idem_claim('spread', scope => %s)", [scope])
        expected = {scope: owner(px, scope) for scope in scopes}
        for scope in scopes[:50]:
            partition, partitions, connstr = px.execute("SELECT * FROM idem_partition_of(%s)", [scope]).fetchone()
            assert (partition, partitions, connstr) == (expected[scope], 4, four.partitions[partition].dsn)
    counts = []
    for i, p in enumerate(four.partitions):
        held = [r[0] for r in p.query("SELECT scope FROM idem_keys WHERE key = 'spread'")]
        assert all(expected[s] == i for s in held), f"partition {i} holds scopes routed elsewhere"
        counts.append(len(held))
    assert sum(counts) == len(scopes)
    # 200 expected per partition; the hash is fixed, so this is a property of the rule, not luck
    assert all(150 <= c <= 250 for c in counts), counts


def test_a_partition_refuses_scopes_it_does_not_own(four):
    with four.proxy.connect() as px:
        wrong = (owner(px, "acme") + 1) % 4
    with four.partitions[wrong].connect() as direct:
        for sql in ["SELECT idem_partition.idem_claim('x', scope => 'acme')",
                    "SELECT idem_partition.idem_complete('x', '{}', scope => 'acme')",
                    "SELECT idem_partition.idem_fail('x', scope => 'acme')",
                    "SELECT idem_partition.idem_lookup('x', scope => 'acme')"]:
            with pytest.raises(psycopg.Error) as error:
                direct.execute(sql)
            assert error.value.sqlstate == "IK900"
            assert f"belongs to partition {owner(direct, 'acme')} of 4, not to partition {wrong}" in str(error.value)
        assert direct.execute("SELECT count(*) FROM idem_keys WHERE key = 'x'").fetchone() == (0,)


def test_same_transaction_mode_on_the_partition_the_proxy_names(four):
    with four.proxy.connect() as px:
        connstr = px.execute("SELECT connstr FROM idem_partition_of('shop-9')").fetchone()[0]
    with psycopg.connect(connstr) as app:   # not autocommit: one transaction per request
        app.execute("CREATE TABLE IF NOT EXISTS orders (scope text, key text, total int)")
        app.commit()
        for commit in (False, True):
            claim = app.execute("SELECT outcome FROM idem_partition.idem_claim('o-1', '{\"t\": 5}',"
                                " scope => 'shop-9')").fetchone()
            assert claim == ("claimed",)
            app.execute("INSERT INTO orders VALUES ('shop-9', 'o-1', 5)")
            app.execute("SELECT idem_partition.idem_complete('o-1', '{\"id\": 1}', scope => 'shop-9')")
            app.commit() if commit else app.rollback()
        assert app.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    with four.proxy.connect() as px:
        assert px.execute("SELECT outcome, response FROM idem_claim('o-1', '{\"t\": 5}', scope => 'shop-9')"
                          ).fetchone() == ("replay", {"id": 1})


def complete_with_effect(conn, scope, key, attempt, client):
    """The client's effect and the key's completion, committed together (or neither)."""
    with conn.transaction():
        conn.execute("INSERT INTO effects VALUES (%s, %s, %s, %s)", [scope, key, attempt, client])
        conn.execute("SELECT idem_complete(%s, %s, 201, scope => %s, attempt => %s)",
                     [key, response(client, attempt), scope, attempt])


def test_exactly_once_through_the_proxy(four):
    """32 clients, 120 keys in 12 scopes, lease mode with 40 ms and 2 s leases: duplicates,
    takeovers of slow and crashed owners, retryable failures, fenced stale owners, callers that
    roll back."""
    with four.proxy.connect() as px:
        px.execute("CREATE TABLE effects (scope text, key text, attempt int, client int)")
    keys = [(f"shop-{i % 12}", f"eo-{i}") for i in range(120)]
    log = ClaimLog()
    fenced = []

    # One stale owner on purpose, so fencing is checked on every run and not only when the random
    # load happens to interleave a takeover with a slow owner: its lease ends, another client
    # takes the key over, and the stale completion (with its effect) is rejected.
    scope, key = keys[0]
    with four.proxy.connect() as stale, four.proxy.connect() as other:
        claim = stale.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => '40 ms')",
                              [key, json.dumps({"k": key}), scope]).fetchone()
        log.outcome(scope, key, claim)
        assert claim[0] == "claimed"
        for _ in range(200):  # the lease has ended once a claim takes the key over
            time.sleep(0.02)
            row = other.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => '40 ms')",
                                [key, json.dumps({"k": key}), scope]).fetchone()
            log.outcome(scope, key, row)
            if row[0] == "claimed":
                break
        assert row[0] == "claimed" and row[2] == claim[2] + 1, row
        with pytest.raises(psycopg.Error) as rejected:
            complete_with_effect(stale, scope, key, claim[2], -2)
        assert rejected.value.sqlstate == "IK002", str(rejected.value)
        fenced.append((scope, key, claim[2]))

        # and one live owner, so in_progress is seen on every run, not only when load allows
        scope, key = keys[1]
        claim = stale.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => '1 hour')",
                              [key, json.dumps({"k": key}), scope]).fetchone()
        log.outcome(scope, key, claim)
        row = other.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => '40 ms')",
                            [key, json.dumps({"k": key}), scope]).fetchone()
        log.outcome(scope, key, row)
        assert (claim[0], row[0]) == ("claimed", "in_progress"), (claim, row)
        complete_with_effect(stale, scope, key, claim[2], -3)

    def client(cid, stop):
        r = rng(cid)
        with four.proxy.connect() as px:
            for _ in range(40):
                scope, key = r.choice(keys)
                roll_back_caller = r.random() < 0.05
                if roll_back_caller:      # the caller's transaction rolls back: the proxied claim does not
                    px.execute("BEGIN")
                # short leases make takeovers and fencing, long ones in_progress, on any machine speed
                lease = r.choice(["40 ms", "2 s"])
                row = px.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => %s)",
                                 [key, json.dumps({"k": key}), scope, lease]).fetchone()
                if roll_back_caller:
                    px.execute("ROLLBACK")
                log.outcome(scope, key, row)
                if row[0] != "claimed" or roll_back_caller:
                    continue
                attempt, fate = row[2], r.random()
                if fate < 0.1:
                    continue                       # crash: the lease runs out, someone takes over
                if fate < 0.2:
                    try:                               # a 40 ms lease may be taken over first
                        px.execute("SELECT idem_fail(%s, scope => %s, attempt => %s)", [key, scope, attempt])
                    except psycopg.Error as e:
                        assert e.sqlstate == "IK002", str(e)
                        fenced.append((scope, key, attempt))
                    continue
                time.sleep(r.uniform(0, 0.06))     # the work, often longer than the lease
                try:
                    complete_with_effect(px, scope, key, attempt, cid)
                except psycopg.Error as e:
                    assert e.sqlstate == "IK002", str(e)
                    fenced.append((scope, key, attempt))

    stop, threads, failures = run_clients(32, client)
    assert join(stop, threads, timeout=240) and not failures, failures

    # drain: whatever is left pending or failed is taken over and finished
    with four.proxy.connect() as px:
        for scope, key in keys:
            while True:
                row = px.execute("SELECT * FROM idem_claim(%s, %s, scope => %s, lease => '40 ms')",
                                 [key, json.dumps({"k": key}), scope]).fetchone()
                log.outcome(scope, key, row)
                if row[0] == "claimed":
                    complete_with_effect(px, scope, key, row[2], -1)
                if row[0] == "replay" or row[0] == "claimed":
                    break
                time.sleep(0.02)
        effects = {(s, k): (a, c) for s, k, a, c in px.execute("SELECT * FROM effects").fetchall()}
        assert px.execute("SELECT count(*) FROM effects").fetchone()[0] == len(effects), "a duplicate effect"

    assert log.double_claims() == [], "an attempt of a key was claimed twice"
    stored = {}
    for p in four.partitions:
        for s, k, state, attempt, resp, code in rows_on(p, "key LIKE 'eo-%'"):
            stored[(s, k)] = (state, attempt, resp, code)
    assert set(stored) == set(keys)
    for sk, (state, attempt, resp, code) in stored.items():
        assert state == "succeeded" and code == 201, (sk, state)
        assert effects[sk][0] == attempt, f"{sk}: the effect is not the completing attempt's"
        assert resp == json.loads(response(effects[sk][1], attempt))
    assert set(effects) == set(keys)
    assert log.outcomes.get("replay", 0) > 0 and log.outcomes.get("in_progress", 0) > 0
    assert effects[keys[1]][1] == -3, "the live owner's completion is the one stored"
    takeovers = sum(1 for _, _, a in log.claims if a > 1)
    assert takeovers > 0 and fenced, (takeovers, len(fenced))
    assert (-2) not in {client for _, client in effects.values()}, "a fenced completion's effect committed"
    print(f"outcomes {log.outcomes}, takeovers {takeovers}, fenced {len(fenced)}")


def test_a_partition_down_fails_only_its_scopes(four):
    scopes = [f"down-{i}" for i in range(32)]
    with four.proxy.connect() as px:
        owners = {s: owner(px, s) for s in scopes}
    victim = four.partitions[2]
    acked = {}            # (scope, key) -> response: completes the proxy acknowledged
    results = {"ok_after_stop": set(), "errors": []}
    stopped = threading.Event()
    lock = threading.Lock()

    def client(cid, stop):
        r = rng(cid)
        with four.proxy.connect() as px:
            n = 0
            while not stop.is_set():
                scope, key = r.choice(scopes), f"d-{cid}-{n}"
                n += 1
                was_stopped = stopped.is_set()
                try:
                    px.execute("SELECT idem_claim(%s, scope => %s)", [key, scope])
                    px.execute("SELECT idem_complete(%s, %s, scope => %s, attempt => 1)",
                               [key, response(cid, 1), scope])
                except psycopg.Error as e:
                    with lock:
                        results["errors"].append((scope, was_stopped, e.sqlstate, str(e)))
                    time.sleep(0.01)
                    continue
                with lock:
                    acked[(scope, key)] = response(cid, 1)
                    if was_stopped:
                        results["ok_after_stop"].add(owners[scope])

    def until(condition, what, timeout=120):
        """Wait for what the clients have seen (a generous limit only ends a hang)."""
        deadline = time.monotonic() + timeout
        while True:
            with lock:
                if condition():
                    return
            assert time.monotonic() < deadline and not failures, f"never: {what} ({failures})"
            time.sleep(0.02)

    stop, threads, failures = run_clients(8, client)
    until(lambda: any(owners[s] == 2 for s, _ in acked), "a key of partition 2 acknowledged")
    victim.stop("immediate")
    stopped.set()
    until(lambda: any(e[1] for e in results["errors"]) and results["ok_after_stop"] >= {0, 1, 3},
          "a failed call to partition 2 and calls to each other partition after the stop")
    with lock:
        during = list(results["errors"])
    victim.start()
    assert join(stop, threads) and not failures, failures

    errors_after_stop = [e for e in during if e[1]]
    assert errors_after_stop, "no call failed while partition 2 was down"
    for scope, _, state, message in errors_after_stop:
        assert owners[scope] == 2, f"a scope of partition {owners[scope]} failed: {message}"
        assert state == "IK901" and message.startswith("partition 2 of 4 is unavailable"), (state, message)
    assert results["ok_after_stop"] >= {0, 1, 3}, "the other partitions did not go on"

    # after the restart: calls to its scopes work again, nothing acknowledged is lost
    with four.proxy.connect() as px:
        scope2 = next(s for s in scopes if owners[s] == 2)
        assert px.execute("SELECT outcome FROM idem_claim('after-restart', scope => %s)", [scope2]
                          ).fetchone() == ("claimed",)
        for (scope, key), resp in acked.items():
            row = px.execute("SELECT state, response FROM idem_lookup(%s, scope => %s)", [key, scope]).fetchone()
            assert row == ("succeeded", json.loads(resp)), (scope, key, row)
    assert len([k for k in acked if owners[k[0]] == 2]) > 0


def test_each_partition_reaps_its_own_keys(four):
    scopes = [f"reap-{i}" for i in range(40)]
    with four.proxy.connect() as px:
        owners = {s: owner(px, s) for s in scopes}
        before = {r[0]: r[1] for r in px.execute("SELECT partition, reaped FROM idem_partition_stats()")}
        for s in scopes:
            px.execute("SELECT idem_claim('short', scope => %s, ttl => '1 second')", [s])
            px.execute("SELECT idem_complete('short', '{}', scope => %s)", [s])
    per_partition = {i: sum(1 for s in scopes if owners[s] == i) for i in range(4)}
    assert all(per_partition.values())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = sum(p.query("SELECT count(*) FROM idem_keys WHERE key = 'short'")[0][0] for p in four.partitions)
        if left == 0:
            break
        time.sleep(0.5)
    assert left == 0, f"{left} expired keys still there after 60 s"
    with four.proxy.connect() as px:
        after = {r[0]: r[1] for r in px.execute("SELECT partition, reaped FROM idem_partition_stats()")}
    for i, p in enumerate(four.partitions):
        assert after[i] - before[i] >= per_partition[i], (i, before[i], after[i])
        assert p.query("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency reaper'"
                       " AND datname = 'idem'")[0][0] == 1


def test_a_role_with_the_documented_grants_can_call_the_partition_functions(four):
    p = four.partitions[0]
    with four.proxy.connect() as px:
        scope = next(s for s in (f"role-{i}" for i in range(100)) if owner(px, s) == 0)
    p.psql_script("idem", "CREATE ROLE app_role LOGIN; GRANT SELECT, INSERT, UPDATE ON idem_keys TO app_role")
    with psycopg.connect(p.dsn + " user=app_role", autocommit=True) as app:
        assert app.execute("SELECT outcome FROM idem_partition.idem_claim('r1', scope => %s)", [scope]
                           ).fetchone() == ("claimed",)
        assert app.execute("SELECT state FROM idem_partition.idem_complete('r1', '{}', scope => %s)", [scope]
                           ).fetchone() == ("succeeded",)
        assert app.execute("SELECT state FROM idem_partition.idem_lookup('r1', scope => %s)", [scope]
                           ).fetchone() == ("succeeded",)
        app.execute("SELECT idem_partition.idem_claim('r2', scope => %s)", [scope])
        assert app.execute("SELECT state FROM idem_partition.idem_fail('r2', scope => %s)", [scope]
                           ).fetchone() == ("failed",)
    with psycopg.connect(p.dsn + " user=app_role", autocommit=True) as app:
        with pytest.raises(psycopg.Error) as error:
            app.execute("SELECT idem_partition.configure(0, 1)")
        assert error.value.sqlstate == "42501"
    p.psql_script("idem", "REVOKE INSERT, UPDATE ON idem_keys FROM app_role")
    with psycopg.connect(p.dsn + " user=app_role", autocommit=True) as app:
        with pytest.raises(psycopg.Error) as error:
            app.execute("SELECT idem_partition.idem_claim('r3', scope => %s)", [scope])
        assert error.value.sqlstate == "42501"


def test_version_1_2_through_the_proxy(four):
    with four.proxy.connect() as px:
        # extend and release by the owner; the release lets the next claim take over at once
        assert px.execute("SELECT attempt FROM idem_claim('v12', scope => 'beta', lease => '1 hour')").fetchone() == (1,)
        assert px.execute("SELECT locked_until > now() + interval '1 hour' FROM idem_extend('v12', 1, '2 hours',"
                          " scope => 'beta')").fetchone() == (True,)
        assert px.execute("SELECT outcome, retry_after_s > 3600 FROM idem_claim('v12', scope => 'beta', wait => '0')"
                          ).fetchone() == ("in_progress", True)
        px.execute("SELECT idem_release('v12', 1, scope => 'beta')")
        assert px.execute("SELECT outcome, attempt FROM idem_claim('v12', scope => 'beta', lease => '1 ms')"
                          ).fetchone() == ("claimed", 2)
        time.sleep(0.05)
        assert ("beta", "v12", 2) in [r[:3] for r in px.execute("SELECT * FROM idem_stalled()").fetchall()]
        # a body and headers come back byte for byte
        body = bytes(range(256))
        px.execute("SELECT idem_complete('v12', NULL, 201, scope => 'beta', attempt => 2, ttl => '1 day',"
                   " body => %s, headers => '{\"Location\": \"/o/1\"}')", [body])
        replay = px.execute("SELECT outcome, response_code, response_body, response_headers"
                            " FROM idem_claim('v12', scope => 'beta')").fetchone()
        assert replay == ("replay", 201, body, {"Location": "/o/1"})
        # forget: a live lease needs force
        px.execute("SELECT idem_claim('v12-live', scope => 'beta', lease => '1 hour')")
        with pytest.raises(psycopg.Error) as error:
            px.execute("SELECT idem_forget('v12-live', scope => 'beta')")
        assert error.value.sqlstate == "IK005"
        assert px.execute("SELECT idem_forget('v12-live', scope => 'beta', force => true)").fetchone() == (True,)
        assert px.execute("SELECT idem_forget('v12', scope => 'beta')").fetchone() == (True,)
        assert px.execute("SELECT idem_lookup('v12', scope => 'beta') IS NULL").fetchone() == (True,)
        with pytest.raises(psycopg.Error) as error:
            px.execute("SELECT idem_extend('gone', 1, '1 min', scope => 'beta')")
        assert error.value.sqlstate == "IK003"


def test_batches_through_the_proxy(four):
    """Extension 1.3's batch calls: a batch runs whole on the partition that owns its scope, in
    lease mode (each proxied call is its own transaction there)."""
    with four.proxy.connect() as px:
        p = four.partitions[owner(px, "queue-a")]
        rows = px.execute("SELECT key, outcome, inserted, attempt FROM idem_claim_batch("
                          " ARRAY['m3', 'm1', 'm2', 'm1'], 'queue-a', lease => '1 hour')").fetchall()
        assert rows == [("m1", "claimed", True, 1), ("m2", "claimed", True, 1), ("m3", "claimed", True, 1)]
        assert px.execute("SELECT key, outcome FROM idem_claim_batch(ARRAY['m1', 'm4'], 'queue-a', wait => '0')"
                          ).fetchall() == [("m1", "in_progress"), ("m4", "claimed")]
        # a stale attempt fails the whole completion: nothing finished
        with pytest.raises(psycopg.Error) as error:
            px.execute("SELECT idem_complete_batch(ARRAY['m1', 'm2'], 'queue-a', attempts => ARRAY[1, 7])")
        assert error.value.sqlstate == "IK002"
        assert px.execute("SELECT idem_complete_batch(ARRAY['m1', 'm2', 'm3'], 'queue-a',"
                          " attempts => ARRAY[1, 1, 1], responses => ARRAY['{\"n\": 1}', NULL, NULL]::jsonb[])"
                          ).fetchone() == (3,)
        assert px.execute("SELECT key, outcome, state, response FROM idem_claim_batch(ARRAY['m2', 'm1'], 'queue-a')"
                          ).fetchall() == [("m1", "replay", "succeeded", {"n": 1}), ("m2", "replay", "succeeded", None)]
        assert rows_on(p, "scope = 'queue-a'") == [
            ("queue-a", "m1", "succeeded", 1, {"n": 1}, 200), ("queue-a", "m2", "succeeded", 1, None, 200),
            ("queue-a", "m3", "succeeded", 1, None, 200), ("queue-a", "m4", "pending", 1, None, None)]
        # applied => true passes through: the claimed ids are stored already applied, one of
        # them known (replay)
        assert px.execute("SELECT key, outcome, state FROM idem_claim_batch(ARRAY['m5', 'm1'], 'queue-a',"
                          " applied => true)").fetchall() == [("m1", "replay", "succeeded"), ("m5", "claimed", "succeeded")]
        assert rows_on(p, "scope = 'queue-a' AND key = 'm5'") == [("queue-a", "m5", "succeeded", 1, None, None)]
        # bad input keeps its SQLSTATE through the proxy
        with pytest.raises(psycopg.Error) as error:
            px.execute("SELECT * FROM idem_claim_batch(ARRAY['ok', NULL], 'queue-a')")
        assert error.value.sqlstate == "22004"
        # a partition refuses a batch of a scope it does not own
        other = four.partitions[(owner(px, "queue-a") + 1) % 4]
        with other.connect() as direct, pytest.raises(psycopg.Error) as error:
            direct.execute("SELECT * FROM idem_partition.idem_claim_batch(ARRAY['x'], 'queue-a')")
        assert error.value.sqlstate == "IK900"


# Every proxied function, called for a scope of the partition that is down: (sql, params)
PROXIED_CALLS = [
    ("SELECT * FROM idem_claim('k', %s, scope => %s)", "request"),
    ("SELECT * FROM idem_complete('k', %s, scope => %s, attempt => 1)", "response"),
    ("SELECT * FROM idem_fail('k', %s, scope => %s, attempt => 1)", "response"),
    ("SELECT * FROM idem_lookup('k', scope => %s)", None),
    ("SELECT * FROM idem_extend('k', 1, '1 min', scope => %s)", None),
    ("SELECT * FROM idem_release('k', 1, scope => %s)", None),
    ("SELECT * FROM idem_forget('k', scope => %s)", None),
    ("SELECT * FROM idem_claim_batch(ARRAY['k'], %s, requests => ARRAY[%s]::jsonb[])", "batch"),
    ("SELECT * FROM idem_complete_batch(ARRAY['k'], %s, responses => ARRAY[%s]::jsonb[])", "batch"),
]
SECRET_BODY = '{"card": "4111-secret-body"}'


def call_params(kind, scope):
    return {"request": [SECRET_BODY, scope], "response": [SECRET_BODY, scope], None: [scope],
            "batch": [scope, SECRET_BODY]}[kind]


def test_a_partition_that_cannot_be_reached_answers_IK901(four):
    """Partition 2 stopped: every proxied function answers IK901 naming the partition, without a
    body or a connection string; the cluster-wide calls answer for the others and name it."""
    victim = four.partitions[2]
    with four.proxy.connect() as px:
        scope = next(s for s in (f"gone-{i}" for i in range(100)) if owner(px, s) == 2)
        live_scope = next(s for s in (f"alive-{i}" for i in range(100)) if owner(px, s) != 2)
        # a password in the proxy's connection string must never reach a message
        dsns = [p.dsn for p in four.partitions]
        dsns[2] += " password=pw-never-shown"
        import idem_scaleout
        px.execute(idem_scaleout.proxy_config_sql(dsns))
    with four.proxy.connect() as warm:   # a session with a connection to partition 2 already open
        warm.execute("SELECT idem_claim('warm', scope => %s)", [scope])
        victim.stop("immediate")
        try:
            with four.proxy.connect() as cold:
                notices = []
                cold.add_notice_handler(lambda d: notices.append((d.sqlstate, d.message_primary)))
                for px in (warm, cold):
                    for sql, kind in PROXIED_CALLS:
                        with pytest.raises(psycopg.Error) as error:
                            px.execute(sql, call_params(kind, scope))
                        e = error.value
                        assert e.sqlstate == "IK901", (sql, e.sqlstate, str(e))
                        assert e.diag.message_primary == "partition 2 of 4 is unavailable", str(e)
                        text = " ".join(filter(None, [e.diag.message_primary, e.diag.message_detail,
                                                      e.diag.message_hint, e.diag.context]))
                        assert e.diag.message_detail, str(e)
                        assert "secret-body" not in text and "pw-never-shown" not in text, text
                # the other partitions answer as before
                assert cold.execute("SELECT outcome FROM idem_claim('alive', scope => %s)", [live_scope]
                                    ).fetchone() == ("claimed",)
                # the cluster-wide calls answer for the partitions that are up and name the other
                stats = cold.execute("SELECT partition, partitions, accepting, available"
                                     " FROM idem_partition_stats() ORDER BY 1").fetchall()
                assert stats == [(0, 4, True, True), (1, 4, True, True), (2, 4, None, False), (3, 4, True, True)]
                cold.execute("SELECT idem_claim('stalled-live', scope => %s, lease => '1 ms')", [live_scope])
                deadline = time.monotonic() + 60
                while True:      # the lease of 1 ms has ended once the partition's clock says so
                    stalled = cold.execute("SELECT scope, key FROM idem_stalled()").fetchall()
                    if (live_scope, "stalled-live") in stalled or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                assert (live_scope, "stalled-live") in stalled
                assert ("IK901", "partition 2 of 4 is unavailable: its stalled keys are not listed") in notices
        finally:
            victim.start()
            with four.proxy.connect() as px:
                px.execute(idem_scaleout.proxy_config_sql([p.dsn for p in four.partitions]))
    with four.proxy.connect() as px:
        assert px.execute("SELECT outcome FROM idem_lookup('warm', scope => %s) l, idem_claim('warm', scope => %s)",
                          [scope, scope]).fetchone() == ("in_progress",)
        assert [r[0] for r in px.execute("SELECT available FROM idem_partition_stats()")] == [True] * 4
