-- idempotency: the exact privileges each function needs (docs/api.md "Privileges",
-- docs/security.md).  For every function, a role with exactly the documented privileges on
-- idem_keys succeeds, and the same role with any one of them taken away gets 42501; nothing is
-- usable by PUBLIC (every function is executable by PUBLIC, as PostgreSQL creates functions, but
-- without table grants each one raises 42501; idem_stats_reset is not executable by PUBLIC).
-- Each try runs in a subtransaction that is rolled back, so the tries do not affect each other.
BEGIN;
SELECT plan(79);

CREATE ROLE regress_idem_x;
DO $$
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO regress_idem_x',
                 (SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idempotency'));
END $$;

-- keys to act on (made by the superuser)
SELECT is((idem_claim('px-pending', '{"p": 1}', 'px', lease => '1 hour')).outcome, 'claimed', 'px-pending');
SELECT is((idem_claim('px-done', '{"p": 2}', 'px')).outcome, 'claimed', 'px-done');
SELECT is((idem_complete('px-done', '{"ok": true}', 200, 'px')).state, 'succeeded', 'px-done finished');

-- try_as(privileges, statement): grants exactly `privileges` on idem_keys to regress_idem_x, runs
-- the statement as that role and returns 'ok' or the SQLSTATE; whatever the statement did is
-- rolled back.
CREATE FUNCTION pg_temp.try_as(privs text, stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    code text;
    msg  text;
BEGIN
    REVOKE ALL ON idem_keys FROM regress_idem_x;
    IF privs <> '' THEN
        EXECUTE format('GRANT %s ON idem_keys TO regress_idem_x', privs);
    END IF;
    SET ROLE regress_idem_x;
    BEGIN
        EXECUTE stmt;
        RAISE EXCEPTION 'try_as: success' USING ERRCODE = 'P0001';
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    END;
    RESET ROLE;
    RETURN CASE WHEN msg = 'try_as: success' THEN 'ok'
                WHEN code = '42501' AND msg <> 'permission denied for table idem_keys'
                    THEN '42501 (' || msg || ')'
                ELSE code END;
END
$$;

-- ---- idem_claim: SELECT, INSERT, UPDATE (for a new key, a finished key and a pending key alike)
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_claim('px-new', NULL, 'px')$$), 'ok',
          'idem_claim of a new key: SELECT, INSERT, UPDATE suffice');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_claim('px-done', '{"p": 2}', 'px')$$), 'ok',
          'idem_claim of a finished key (replay): SELECT, INSERT, UPDATE suffice');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_claim('px-pending', '{"p": 1}', 'px')$$), 'ok',
          'idem_claim of a pending key (in_progress): SELECT, INSERT, UPDATE suffice');
SELECT is(pg_temp.try_as('INSERT, UPDATE', $$SELECT idem_claim('px-new', NULL, 'px')$$), '42501',
          'idem_claim without SELECT -> 42501');
SELECT is(pg_temp.try_as('SELECT, UPDATE', $$SELECT idem_claim('px-new', NULL, 'px')$$), '42501',
          'idem_claim without INSERT -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT', $$SELECT idem_claim('px-new', NULL, 'px')$$), '42501',
          'idem_claim without UPDATE -> 42501');
SELECT is(pg_temp.try_as('SELECT', $$SELECT idem_claim('px-done', '{"p": 2}', 'px')$$), '42501',
          'idem_claim of a finished key (a replay would write nothing) with SELECT only -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT', $$SELECT idem_claim('px-pending', '{"p": 1}', 'px')$$), '42501',
          'idem_claim of a pending key without UPDATE -> 42501');
SELECT is(pg_temp.try_as('', $$SELECT idem_claim('px-new', NULL, 'px')$$), '42501',
          'idem_claim with no privilege -> 42501');

-- ---- idem_complete and idem_fail: SELECT, INSERT, UPDATE
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_complete('px-pending', '{}', 200, 'px')$$), 'ok',
          'idem_complete: SELECT, INSERT, UPDATE suffice');
SELECT is(pg_temp.try_as('INSERT, UPDATE', $$SELECT idem_complete('px-pending', '{}', 200, 'px')$$), '42501',
          'idem_complete without SELECT -> 42501');
SELECT is(pg_temp.try_as('SELECT, UPDATE', $$SELECT idem_complete('px-pending', '{}', 200, 'px')$$), '42501',
          'idem_complete without INSERT -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT', $$SELECT idem_complete('px-pending', '{}', 200, 'px')$$), '42501',
          'idem_complete without UPDATE -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT', $$SELECT idem_complete('px-missing', '{}', 200, 'px')$$), '42501',
          'idem_complete of a missing key without UPDATE -> 42501 (privileges before the key: no IK003)');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_complete('px-missing', '{}', 200, 'px')$$), 'IK003',
          'idem_complete of a missing key with the privileges -> IK003');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_fail('px-pending', NULL, 500, true, 'px')$$), 'ok',
          'idem_fail: SELECT, INSERT, UPDATE suffice');
SELECT is(pg_temp.try_as('INSERT, UPDATE', $$SELECT idem_fail('px-pending', NULL, 500, true, 'px')$$), '42501',
          'idem_fail without SELECT -> 42501');
SELECT is(pg_temp.try_as('SELECT, UPDATE', $$SELECT idem_fail('px-pending', NULL, 500, true, 'px')$$), '42501',
          'idem_fail without INSERT -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT', $$SELECT idem_fail('px-pending', NULL, 500, true, 'px')$$), '42501',
          'idem_fail without UPDATE -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_fail('px-done', NULL, 500, true, 'px')$$), 'IK004',
          'idem_fail of a finished key with the privileges -> IK004');

-- ---- idem_lookup: SELECT
SELECT is(pg_temp.try_as('SELECT', $$SELECT idem_lookup('px-done', 'px')$$), 'ok', 'idem_lookup: SELECT suffices');
SELECT is(pg_temp.try_as('SELECT', $$SELECT idem_lookup('px-missing', 'px')$$), 'ok',
          'idem_lookup of a missing key: SELECT suffices');
SELECT is(pg_temp.try_as('INSERT, UPDATE, DELETE', $$SELECT idem_lookup('px-done', 'px')$$), '42501',
          'idem_lookup without SELECT -> 42501');
SELECT is(pg_temp.try_as('', $$SELECT idem_lookup('px-missing', 'px')$$), '42501',
          'idem_lookup with no privilege -> 42501, even for a missing key');
-- only table-level privileges count: every column's SELECT is not enough
SELECT is(pg_temp.try_as('SELECT (scope, key, state, attempt, fingerprint, response, response_code, retryable, '
                         'created_at, locked_until, completed_at, expires_at)',
                         $$SELECT idem_lookup('px-done', 'px')$$), '42501',
          'idem_lookup with SELECT on every column but not on the table -> 42501');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE (scope, key, state, attempt, fingerprint, response, response_code, '
                         'retryable, created_at, locked_until, completed_at, expires_at)',
                         $$SELECT idem_claim('px-new', NULL, 'px')$$), '42501',
          'idem_claim with column-level UPDATE -> 42501');

-- ---- idem_reap and idem_reap_all: DELETE
SELECT is(pg_temp.try_as('DELETE', $$SELECT idem_reap()$$), 'ok', 'idem_reap: DELETE suffices');
SELECT is(pg_temp.try_as('DELETE', $$SELECT idem_reap(1)$$), 'ok', 'idem_reap(1): DELETE suffices');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$SELECT idem_reap()$$), '42501', 'idem_reap without DELETE -> 42501');
SELECT is(pg_temp.try_as('', $$SELECT idem_reap()$$), '42501', 'idem_reap with no privilege -> 42501');
-- (idem_reap_all commits, which it cannot do here: reaching that COMMIT (2D000) shows that the
-- privilege checks passed)
SELECT is(pg_temp.try_as('DELETE', $$CALL idem_reap_all()$$), '2D000',
          'idem_reap_all: DELETE suffices (it gets as far as its first COMMIT)');
SELECT is(pg_temp.try_as('SELECT, INSERT, UPDATE', $$CALL idem_reap_all()$$), '42501',
          'idem_reap_all without DELETE -> 42501');
SELECT is(pg_temp.try_as('DELETE', $$CALL idem_reap_all(0)$$), '22023',
          'idem_reap_all: argument errors come first');

-- ---- argument errors come before privileges; privileges before the key's state
SELECT is(pg_temp.try_as('', $$SELECT idem_claim('', NULL, 'px')$$), '22023', 'no privilege, bad key -> 22023');
SELECT is(pg_temp.try_as('', $$SELECT idem_complete(NULL, '{}')$$), '22004', 'no privilege, NULL key -> 22004');
SELECT is(pg_temp.try_as('', $$SELECT idem_reap(0)$$), '22023', 'no privilege, max_rows 0 -> 22023');

-- ---- PUBLIC
SELECT is(
    (SELECT string_agg(p.proname, ',' ORDER BY p.proname) FROM pg_proc p
      JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
      JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
     WHERE has_function_privilege('regress_idem_x', p.oid, 'EXECUTE')),
    'idem_claim,idem_claim_batch,idem_complete,idem_complete_batch,idem_edition,idem_extend,idem_fail,idem_forget,idem_lookup,idem_reap,idem_reap_all,idem_release,idem_row_security_apply,idem_row_security_check,idem_schedule_reaper,idem_scope_stats_get,idem_stats_dealloc,idem_stats_get,idem_unschedule_reaper',
    'PUBLIC may execute every routine but idem_stats_reset, idem_scope_stats_reset and the triggers'' functions (idem_row_security_apply checks the ownership of idem_keys itself)');
SELECT is(
    (SELECT count(*) FROM pg_class c, aclexplode(c.relacl) a
      WHERE c.oid IN ('idem_keys'::regclass, 'idem_stats'::regclass) AND a.grantee = 0),
    0::bigint, 'PUBLIC has no privilege on idem_keys or idem_stats');
SELECT table_privs_are('idem_keys', 'regress_idem_x', ARRAY[]::text[], 'a new role has nothing on idem_keys');
SELECT is(
    (SELECT count(*) FROM pg_type t
      JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
      JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
     WHERE NOT has_type_privilege('regress_idem_x', t.oid, 'USAGE')),
    0::bigint, 'the types are usable by everyone (needed to call the functions; they hold no data)');
-- every function, for a role with nothing granted: 42501, never a result
SET ROLE regress_idem_x;
SELECT throws_ok($$SELECT idem_claim('px-new', NULL, 'px')$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_claim -> 42501');
SELECT throws_ok($$SELECT idem_complete('px-pending', '{}', 200, 'px')$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_complete -> 42501');
SELECT throws_ok($$SELECT idem_fail('px-pending', NULL, 500, true, 'px')$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_fail -> 42501');
SELECT throws_ok($$SELECT idem_lookup('px-done', 'px')$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_lookup -> 42501');
SELECT throws_ok($$SELECT idem_reap()$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_reap -> 42501');
SELECT throws_ok($$CALL idem_reap_all()$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: idem_reap_all -> 42501');
SELECT throws_ok($$SELECT * FROM idem_keys$$, '42501', 'permission denied for table idem_keys', 'PUBLIC: SELECT from idem_keys -> 42501');
SELECT throws_ok($$SELECT idem_stats_reset()$$, '42501', 'permission denied for function idem_stats_reset',
                 'PUBLIC: idem_stats_reset -> 42501 (like pg_stat_reset)');
SELECT throws_ok($$SELECT * FROM idem_stats$$, '42501', 'permission denied for view idem_stats',
                 'PUBLIC: the idem_stats view needs a grant');
-- the view's function is executable by PUBLIC: the counters (not keys, not bodies) are readable
-- through it, as pg_stat_all_tables shows every table's row counts to everyone
SELECT lives_ok($$SELECT * FROM idem_stats_get()$$, 'PUBLIC: idem_stats_get() answers (counters only)');
-- idem_scope_stats is granted to PUBLIC and filters: scope names (tenants) only for
-- pg_read_all_stats and readers of idem_keys.scope
SELECT is((SELECT count(*) FROM idem_scope_stats), 0::bigint, 'PUBLIC: idem_scope_stats shows no row');
SELECT throws_ok($$SELECT idem_scope_stats_reset()$$, '42501', 'permission denied for function idem_scope_stats_reset',
                 'PUBLIC: idem_scope_stats_reset -> 42501');
-- scheduling is open to anyone; without pg_cron in this database it says what to run instead,
-- and the job itself runs as the user who scheduled it, with that user's privileges
SELECT throws_ok($$SELECT idem_schedule_reaper()$$, '55000', NULL, 'PUBLIC: idem_schedule_reaper without pg_cron -> 55000, not 42501');
SELECT throws_ok($$SELECT idem_unschedule_reaper()$$, '55000', NULL, 'PUBLIC: idem_unschedule_reaper without pg_cron -> 55000');
RESET ROLE;

-- ---- the grant recipes of docs/security.md
CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_readonly;
CREATE ROLE regress_idem_reaper;
CREATE ROLE regress_idem_monitor;
DO $$
DECLARE s text := (SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idempotency');
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO regress_idem_app, regress_idem_readonly, regress_idem_reaper, regress_idem_monitor', s);
END $$;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO regress_idem_app;
GRANT SELECT ON idem_keys TO regress_idem_readonly;
GRANT DELETE ON idem_keys TO regress_idem_reaper;
GRANT SELECT ON idem_stats TO regress_idem_monitor;
GRANT EXECUTE ON FUNCTION idem_stats_reset() TO regress_idem_monitor;

SET ROLE regress_idem_app;
SELECT is((idem_claim('px-app', '{"a": 1}', 'px')).outcome, 'claimed', 'app role: claim');
SELECT is((idem_complete('px-app', '{"r": 1}', 201, 'px')).state, 'succeeded', 'app role: complete');
SELECT is((idem_claim('px-app', '{"a": 1}', 'px')).outcome, 'replay', 'app role: replay');
SELECT is((idem_claim('px-app-2', NULL, 'px')).outcome, 'claimed', 'app role: claim another');
SELECT is((idem_fail('px-app-2', NULL, 503, true, 'px')).state, 'failed', 'app role: fail');
SELECT is((idem_lookup('px-app', 'px')).response_code, 201, 'app role: lookup');
SELECT throws_ok($$SELECT idem_reap()$$, '42501', NULL, 'app role: cannot reap');
SELECT throws_ok($$DELETE FROM idem_keys$$, '42501', NULL, 'app role: cannot delete keys with SQL either');
RESET ROLE;
SET ROLE regress_idem_readonly;
SELECT is((idem_lookup('px-app', 'px')).state::text, 'succeeded', 'read-only role: lookup');
SELECT is((SELECT count(*) FROM idem_keys WHERE scope = 'px'), 4::bigint, 'read-only role: plain SELECT');
SELECT throws_ok($$SELECT idem_claim('px-ro', NULL, 'px')$$, '42501', NULL, 'read-only role: cannot claim');
SELECT throws_ok($$SELECT idem_complete('px-pending', '{}', 200, 'px')$$, '42501', NULL, 'read-only role: cannot complete');
RESET ROLE;
SET ROLE regress_idem_reaper;
SELECT is(idem_reap(), 0::bigint, 'reaper role: reap (nothing expired)');
SELECT throws_ok($$SELECT idem_lookup('px-app', 'px')$$, '42501', NULL, 'reaper role: cannot read keys');
SELECT throws_ok($$SELECT idem_claim('px-reaper', NULL, 'px')$$, '42501', NULL, 'reaper role: cannot claim');
RESET ROLE;
SET ROLE regress_idem_monitor;
SELECT lives_ok($$SELECT * FROM idem_stats$$, 'monitoring role: idem_stats');
SELECT lives_ok($$SELECT idem_stats_reset()$$, 'monitoring role: idem_stats_reset');
SELECT throws_ok($$SELECT idem_lookup('px-app', 'px')$$, '42501', NULL, 'monitoring role: cannot read keys');
RESET ROLE;

-- ---- privileges are the current user's, as for SQL: role membership with and without INHERIT,
-- and a SECURITY DEFINER wrapper
CREATE ROLE regress_idem_member IN ROLE regress_idem_app;
CREATE ROLE regress_idem_noinherit NOINHERIT IN ROLE regress_idem_app;
SET ROLE regress_idem_member;
SELECT is((idem_claim('px-member', NULL, 'px')).outcome, 'claimed', 'a member of the app role inherits its privileges');
RESET ROLE;
SET ROLE regress_idem_noinherit;
SELECT throws_ok($$SELECT idem_claim('px-noinherit', NULL, 'px')$$, '42501', NULL,
                 'a NOINHERIT member does not use them...');
SET ROLE regress_idem_app;
SELECT is((idem_claim('px-noinherit', NULL, 'px')).outcome, 'claimed', '... until it SETs ROLE to the app role');
RESET ROLE;
CREATE FUNCTION pg_temp.claim_for_anyone(k text) RETURNS text
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
    AS $$ SELECT outcome::text FROM idem_claim(k, NULL, 'px') $$;
ALTER FUNCTION pg_temp.claim_for_anyone(text) OWNER TO regress_idem_app;
SET ROLE regress_idem_x;
SELECT is(pg_temp.claim_for_anyone('px-definer'), 'claimed',
          'a SECURITY DEFINER wrapper owned by the app role claims for a role without privileges');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
