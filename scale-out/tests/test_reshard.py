"""The resharding procedure, run for real: 2 partitions become 4 under load through two proxies,
with keys in every state and live leases. Nothing is lost, nothing is claimable twice, during or
after the move, and both proxies route by 4 partitions afterwards."""

import json
import threading
import time

import psycopg

import idem_scaleout
from load import ClaimLog, join, response, rng, run_clients

SCOPES = [f"t-{i}" for i in range(64)]


def all_rows(partitions):
    rows = {}
    for i, p in enumerate(partitions):
        for row in p.query("SELECT * FROM idem_keys"):
            rows.setdefault((row[0], row[1]), []).append((i, row))
    return rows


def test_reshard_2_to_4_under_load(two_plus_two):
    d = two_plus_two
    with d.proxy.connect() as px:
        for s in SCOPES:
            px.execute("SELECT idem_claim('succeeded', scope => %s)", [s])
            px.execute("SELECT idem_complete('succeeded', '{\"ok\": 1}', 201, scope => %s)", [s])
            px.execute("SELECT idem_claim('final', scope => %s)", [s])
            px.execute("SELECT idem_fail('final', '{\"no\": 1}', 422, retryable => false, scope => %s)", [s])
            px.execute("SELECT idem_claim('retryable', scope => %s)", [s])
            px.execute("SELECT idem_fail('retryable', scope => %s)", [s])
            px.execute("SELECT idem_claim('live', scope => %s, lease => '1 hour')", [s])
            px.execute("SELECT idem_claim('stale', scope => %s, lease => '1 millisecond')", [s])
        owner4 = {s: px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [s]).fetchone()[0]
                  for s in SCOPES}
    before = all_rows(d.partitions[:2])
    assert len(before) == 5 * len(SCOPES)

    log = ClaimLog()
    wrong = []                     # claims that must never happen
    acked = {}
    lock = threading.Lock()

    def call(px, sql, params):
        """One proxied call; IK900 (the scope moved under it) is retried, as a client would."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                return px.execute(sql, params).fetchone()
            except psycopg.Error as e:
                log.error(e)
                if e.sqlstate != "IK900":
                    raise
                time.sleep(0.005)
        raise AssertionError("IK900 for 120 s")

    def client(cid, stop):
        r = rng(cid)
        n = 0
        with d.proxies[cid % 2].connect() as px:      # half the clients on each proxy
            while not stop.is_set():
                scope, kind = r.choice(SCOPES), r.choice(["new", "new", "live", "stale", "retryable",
                                                          "succeeded", "final"])
                key = f"new-{cid}-{n}" if kind == "new" else kind
                n += 1
                row = call(px, "SELECT * FROM idem_claim(%s, scope => %s)", [key, scope])
                log.outcome(scope, key, row)
                if row[0] != "claimed":
                    continue
                if kind in ("live", "succeeded", "final"):
                    with lock:
                        wrong.append((scope, key, row))
                    continue
                call(px, "SELECT idem_complete(%s, %s, scope => %s, attempt => %s)",
                     [key, response(cid, row[2]), scope, row[2]])
                with lock:
                    acked[(scope, key)] = (row[2], response(cid, row[2]))

    stop, threads, failures = run_clients(8, client)
    # the move starts and ends under load on any machine: counted claims, not elapsed time
    assert log.wait_for_calls(200), f"the clients made {log.calls()} claims before the move"
    result = idem_scaleout.reshard([px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]], log=print)
    after_move = log.calls()
    assert log.wait_for_calls(after_move + 200), f"the clients made {log.calls() - after_move} claims after the move"
    assert join(stop, threads) and not failures, failures
    print(f"resharding: {result}; outcomes {log.outcomes}; errors {log.errors}")

    assert result["moved"][2] > 0 and result["moved"][3] > 0
    assert sum(result["deleted"].values()) == sum(result["moved"].values())
    assert wrong == [], "a live lease or a finished key was claimed"
    assert log.double_claims() == [], "an attempt was claimed twice"
    assert set(log.errors) <= {"IK900"}, log.errors

    after = all_rows(d.partitions)
    for (scope, key), copies in after.items():
        assert len(copies) == 1, f"{scope}/{key} is on partitions {[i for i, _ in copies]}"
        assert copies[0][0] == owner4[scope], f"{scope}/{key} is on partition {copies[0][0]}, routed to {owner4[scope]}"
    for (scope, key), old in before.items():
        assert (scope, key) in after, f"{scope}/{key} was lost"
        row = after[(scope, key)][0][1]
        if key in ("succeeded", "final", "live"):
            assert row == old[0][1], f"{scope}/{key} changed: {old[0][1]} -> {row}"
        else:       # taken over at most once (attempt 2) and then completed by its new owner
            assert row[3] in (1, 2), row
    for (scope, key), (attempt, resp) in acked.items():
        row = after[(scope, key)][0][1]
        assert (row[2], row[3], row[5]) == ("succeeded", attempt, json.loads(resp)), (scope, key, row)

    for proxy in d.proxies:
        with proxy.connect() as px:
            assert px.execute("SELECT max(partitions) FROM idem_partition_of('t-1')").fetchone() == (4,)
            for s in SCOPES:       # after the move: replays and in_progress, never a second owner
                assert px.execute("SELECT outcome FROM idem_claim('succeeded', scope => %s)", [s]
                                  ).fetchone() == ("replay",)
                assert px.execute("SELECT outcome FROM idem_claim('live', scope => %s)", [s]
                                  ).fetchone() == ("in_progress",)
            stats = px.execute("SELECT partition, partitions, accepting FROM idem_partition_stats() ORDER BY 1"
                               ).fetchall()
            assert stats == [(i, 4, True) for i in range(4)]

    # the old partitions refuse the scopes they gave away (a caller still routing by 2 partitions)
    moved_scope = next(s for s in SCOPES if owner4[s] == 2)
    with d.partitions[0].connect() as direct:
        try:
            direct.execute("SELECT idem_partition.idem_claim('succeeded', scope => %s)", [moved_scope])
            raise AssertionError("partition 0 accepted a moved scope")
        except psycopg.Error as e:
            assert e.sqlstate == "IK900" and "belongs to partition 2 of 4" in str(e), str(e)

    # running the tool again finishes nothing twice and changes nothing
    again = idem_scaleout.reshard([px.dsn for px in d.proxies], [p.dsn for p in d.partitions[2:]], log=print)
    assert again["moved"] == {} and sum(again["deleted"].values()) == 0
    assert all_rows(d.partitions) == after
