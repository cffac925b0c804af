-- idempotency: the record of idem_keys' row-level security attacked by a role with PUBLIC's
-- privileges only (docs/security.md "Row-level security across dumps and restores"). The record
-- is loaded but not in force, as after a data-only restore with --disable-triggers: DDL on the
-- role's own temporary tables with code that sets the settings 1.5 trusted, settings set in the
-- session, direct writes and calls change nothing, and the confined role is refused (IK006) in
-- this very session throughout. Everything is rolled back.
BEGIN;
SELECT plan(16);

CREATE ROLE regress_idem_tenant;
CREATE ROLE regress_idem_mallory;
DO $$
DECLARE
    s text := (SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idempotency');
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO regress_idem_tenant, regress_idem_mallory', s);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.idem_keys TO regress_idem_tenant', s);
END $$;
SELECT is((idem_claim('other-tenant', '{"n": 1}', 'other')).outcome, 'claimed', 'a key of another tenant');

ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY regress_tenant ON idem_keys USING (scope = current_user) WITH CHECK (scope = current_user);
SELECT results_eq($$SELECT enabled, forced FROM idem_row_security$$, $$VALUES (true, false)$$,
    'ENABLE ROW LEVEL SECURITY is recorded');

-- the state a data-only restore with --disable-triggers leaves: recorded, not in force
ALTER TABLE idem_row_security DISABLE TRIGGER USER;
ALTER TABLE idem_policies DISABLE TRIGGER USER;
DROP POLICY regress_tenant ON idem_keys;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
INSERT INTO idem_row_security (enabled, forced) VALUES (true, false);
INSERT INTO idem_policies (name, permissive, command, roles, using_expr, check_expr, named)
VALUES ('regress_tenant', true, 'ALL', '{public}', '(scope = CURRENT_USER)', '(scope = CURRENT_USER)', '');
ALTER TABLE idem_row_security ENABLE TRIGGER USER;
ALTER TABLE idem_policies ENABLE TRIGGER USER;
CREATE TEMP TABLE recorded AS
    SELECT (SELECT array_agg(r) FROM idem_row_security r)::text AS flags,
           (SELECT array_agg(p ORDER BY p.name) FROM idem_policies p)::text AS policies;
GRANT SELECT ON recorded TO PUBLIC;

SET ROLE regress_idem_tenant;
SELECT throws_ok($$SELECT idem_lookup('other-tenant', 'other')$$, 'IK006', NULL,
    'not in force: the tenant is refused');
RESET ROLE;

SET ROLE regress_idem_mallory;
SELECT lives_ok($$
    CREATE TEMP TABLE x(a int);
    INSERT INTO x VALUES (1);
    ALTER TABLE x ADD CONSTRAINT c CHECK (set_config('idempotency_row_security.before', 'x', true) <> '')
$$, 'mallory: an ALTER TABLE of its own table with a CHECK that sets the 1.5 setting');
SELECT lives_ok($$
    ALTER TABLE x ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY,
        ADD CONSTRAINT c2 CHECK (set_config('idempotency_row_security.applying', 'off', true) <> '')
$$, 'mallory: row-level security subcommands on its own table, with settings set inside');
SELECT lives_ok($$
    SET LOCAL idempotency_row_security.applying = on;
    SET LOCAL idempotency_row_security.before = 'falsefalse';
    CREATE TEMP TABLE idem_keys(scope text);
    ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
    CREATE POLICY regress_tenant ON idem_keys USING (true);
    DROP POLICY regress_tenant ON idem_keys;
    ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
    DROP TABLE pg_temp.idem_keys
$$, 'mallory: a temporary idem_keys of its own, with policies, the settings set');
SELECT throws_ok($$DELETE FROM idem_row_security$$, '42501', NULL, 'mallory cannot erase the flags');
SELECT throws_ok($$TRUNCATE idem_policies$$, '42501', NULL, 'mallory cannot erase the policies');
SELECT throws_ok($$SELECT idem_row_security_apply()$$, '42501', NULL, 'mallory cannot apply the record');
SELECT throws_ok($$ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY$$, '42501', NULL,
    'mallory cannot alter idem_keys');
RESET ROLE;
RESET idempotency_row_security.applying;

SELECT is((SELECT array_agg(r) FROM idem_row_security r)::text, (SELECT flags FROM recorded),
    'the recorded flags are unchanged');
SELECT is((SELECT array_agg(p ORDER BY p.name) FROM idem_policies p)::text, (SELECT policies FROM recorded),
    'the recorded policies are unchanged');
SET ROLE regress_idem_tenant;
SELECT throws_ok($$SELECT idem_lookup('other-tenant', 'other')$$, 'IK006', NULL,
    'after the attacks the tenant is still refused, in the same session');
RESET ROLE;

SELECT is(idem_row_security_apply(), 1, 'the owner applies the record');
SELECT results_eq($$SELECT relrowsecurity FROM pg_class WHERE oid = 'idem_keys'::regclass$$, $$VALUES (true)$$,
    'with row-level security enabled');
SET ROLE regress_idem_tenant;
SELECT ok(idem_lookup('other-tenant', 'other') IS NULL, 'the tenant is served, isolated');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
