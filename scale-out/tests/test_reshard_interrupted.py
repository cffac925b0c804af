"""A resharding that fails half-way, before and after the proxy's switch, then runs again: at
every point each scope has one accepting owner, and the second run completes the move."""

import psycopg
import pytest

import idem_scaleout
from test_reshard import all_rows

SCOPES = [f"i-{i}" for i in range(48)]
FAIL_ON = """CREATE FUNCTION fail_now() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
             CREATE TRIGGER injected BEFORE {event} ON idem_keys FOR EACH ROW EXECUTE FUNCTION fail_now()"""
UNDO = "DROP TRIGGER injected ON idem_keys; DROP FUNCTION fail_now()"


def configs(d):
    return [p.query("SELECT partition, partitions, accepting FROM idem_partition.config")[0:1] for p in d.partitions]


def check_through_proxy(d):
    """Every scope answers from its one owner: finished keys replay, live leases are in progress."""
    with d.proxy.connect() as px:
        for s in SCOPES:
            assert px.execute("SELECT outcome FROM idem_claim('done', scope => %s)", [s]).fetchone() == ("replay",)
            assert px.execute("SELECT outcome FROM idem_claim('live', scope => %s)", [s]).fetchone() == ("in_progress",)


def test_reshard_fails_half_way_and_runs_again(two_plus_two_again):
    d = two_plus_two_again
    new_dsns = [p.dsn for p in d.partitions[2:]]
    with d.proxy.connect() as px:
        for s in SCOPES:
            px.execute("SELECT idem_claim('done', scope => %s)", [s])
            px.execute("SELECT idem_complete('done', '{\"n\": 1}', scope => %s)", [s])
            px.execute("SELECT idem_claim('live', scope => %s, lease => '1 hour')", [s])
        owner4 = {s: px.execute("SELECT idem_partition.idem_scope_partition(%s, 4)", [s]).fetchone()[0]
                  for s in SCOPES}
    before = all_rows(d.partitions[:2])

    # 1. the copy into partition 3 fails: nothing changed, nothing locked, the proxy still has 2
    d.partitions[3].psql_script("idem", FAIL_ON.format(event="INSERT"))
    with pytest.raises(psycopg.Error, match="injected failure"):
        idem_scaleout.reshard(d.proxy.dsn, new_dsns, log=print)
    assert all_rows(d.partitions) == before
    assert configs(d)[:3] == [[(0, 2, True)], [(1, 2, True)], [(2, 4, False)]]
    with d.proxy.connect() as px:
        assert px.execute("SELECT partitions FROM idem_partition_of('x')").fetchone() == (2,)
    check_through_proxy(d)
    d.partitions[3].psql_script("idem", UNDO)

    # 2. partition 1 fails to give up its moved keys, after the proxy's switch
    d.partitions[1].psql_script("idem", FAIL_ON.format(event="DELETE"))
    with pytest.raises(psycopg.Error, match="injected failure"):
        idem_scaleout.reshard(d.proxy.dsn, new_dsns, log=print)
    with d.proxy.connect() as px:
        assert px.execute("SELECT partitions FROM idem_partition_of('x')").fetchone() == (4,)
    assert configs(d) == [[(0, 4, True)], [(1, 2, True)], [(2, 4, True)], [(3, 4, True)]]
    check_through_proxy(d)            # the stale copies on partition 1 are never reached
    d.partitions[1].psql_script("idem", UNDO)

    # 3. running it again finishes the move
    result = idem_scaleout.reshard(d.proxy.dsn, new_dsns, log=print)
    assert result["moved"] == {} and result["deleted"][1] > 0 and result["deleted"][0] == 0
    assert configs(d) == [[(i, 4, True)] for i in range(4)]
    after = all_rows(d.partitions)
    assert set(after) == set(before)
    for (scope, key), copies in after.items():
        assert [i for i, _ in copies] == [owner4[scope]], (scope, key, [i for i, _ in copies])
        assert copies[0][1] == before[(scope, key)][0][1]
    check_through_proxy(d)
