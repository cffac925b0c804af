-- idempotency: privileges (docs/contract.md §7).
-- claim, complete and fail need SELECT, INSERT and UPDATE on idem_keys; lookup SELECT;
-- reap DELETE.  PUBLIC has nothing on idem_keys.  The functions are not SECURITY DEFINER,
-- so a role without table privileges gets 42501 from each of them.
-- Row-level security on idem_keys is enforced (through SQL), never bypassed.
BEGIN;
SELECT plan(31);

SELECT table_privs_are('idem_keys', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on idem_keys');

CREATE ROLE regress_idem_tap;
-- the role can reach the extension schema (wherever it is) but has no table privilege
DO $$
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO regress_idem_tap',
                 (SELECT extnamespace::regnamespace::text FROM pg_extension
                   WHERE extname = 'idempotency'));
END $$;
SELECT table_privs_are('idem_keys', 'regress_idem_tap', ARRAY[]::text[],
                       'regress_idem_tap has no privilege on idem_keys');

-- a key that exists, so that complete/fail would otherwise find something
SELECT is((idem_claim('tap-existing')).outcome, 'claimed', 'superuser claims tap-existing');

SET ROLE regress_idem_tap;
SELECT throws_ok($$SELECT idem_claim('tap-new')$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_claim -> 42501');
SELECT throws_ok($$SELECT idem_complete('tap-existing', '{}')$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_complete -> 42501');
SELECT throws_ok($$SELECT idem_complete('tap-missing', '{}')$$, '42501',
                 'permission denied for table idem_keys',
                 'no privileges: idem_complete of a missing key -> 42501, not IK003');
SELECT throws_ok($$SELECT idem_fail('tap-existing')$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_fail -> 42501');
SELECT throws_ok($$SELECT idem_lookup('tap-existing')$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_lookup -> 42501');
SELECT throws_ok($$SELECT idem_reap()$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_reap -> 42501');
SELECT throws_ok($$CALL idem_reap_all()$$, '42501',
                 'permission denied for table idem_keys', 'no privileges: idem_reap_all -> 42501');
RESET ROLE;

-- SELECT only: lookup works, nothing else
GRANT SELECT ON idem_keys TO regress_idem_tap;
SET ROLE regress_idem_tap;
SELECT is((idem_lookup('tap-existing')).state, 'pending', 'SELECT: idem_lookup works');
SELECT throws_ok($$SELECT idem_claim('tap-new')$$, '42501',
                 'permission denied for table idem_keys', 'SELECT only: idem_claim -> 42501');
SELECT throws_ok($$SELECT idem_claim('tap-existing')$$, '42501',
                 'permission denied for table idem_keys',
                 'SELECT only: idem_claim of an existing key -> 42501');
SELECT throws_ok($$SELECT idem_complete('tap-existing', '{}')$$, '42501',
                 'permission denied for table idem_keys', 'SELECT only: idem_complete -> 42501');
SELECT throws_ok($$SELECT idem_fail('tap-existing')$$, '42501',
                 'permission denied for table idem_keys', 'SELECT only: idem_fail -> 42501');
SELECT throws_ok($$SELECT idem_reap()$$, '42501',
                 'permission denied for table idem_keys', 'SELECT only: idem_reap -> 42501');
RESET ROLE;

-- SELECT and INSERT, no UPDATE: claim still needs UPDATE
GRANT INSERT ON idem_keys TO regress_idem_tap;
SET ROLE regress_idem_tap;
SELECT throws_ok($$SELECT idem_claim('tap-new')$$, '42501',
                 'permission denied for table idem_keys', 'SELECT, INSERT: idem_claim -> 42501');
SELECT throws_ok($$SELECT idem_complete('tap-existing', '{}')$$, '42501',
                 'permission denied for table idem_keys', 'SELECT, INSERT: idem_complete -> 42501');
RESET ROLE;

-- SELECT, INSERT and UPDATE: claim, complete and fail work; reap still needs DELETE
GRANT UPDATE ON idem_keys TO regress_idem_tap;
SET ROLE regress_idem_tap;
SELECT is((idem_claim('tap-new')).outcome, 'claimed', 'SELECT, INSERT, UPDATE: idem_claim works');
SELECT is((idem_complete('tap-new', '{"ok": true}')).state, 'succeeded',
          'SELECT, INSERT, UPDATE: idem_complete works');
SELECT is((idem_fail('tap-existing', retryable => false)).state, 'failed',
          'SELECT, INSERT, UPDATE: idem_fail works');
SELECT throws_ok($$SELECT idem_reap()$$, '42501',
                 'permission denied for table idem_keys', 'no DELETE: idem_reap -> 42501');
RESET ROLE;

-- plus DELETE: reap works
GRANT DELETE ON idem_keys TO regress_idem_tap;
SET ROLE regress_idem_tap;
SELECT lives_ok($$SELECT idem_reap()$$, 'SELECT, INSERT, UPDATE, DELETE: idem_reap works');
RESET ROLE;

-- Row-level security enabled on idem_keys is enforced, never bypassed: for a role that RLS
-- applies to, the functions go through SQL, where the policies apply. With no policy (default
-- deny) the role can create no key and sees none; a permissive policy lets everything work.
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
SET ROLE regress_idem_tap;
SELECT throws_ok($$SELECT idem_claim('tap-rls')$$, '42501', NULL, 'RLS, no policy: idem_claim -> 42501');
SELECT throws_ok($$SELECT idem_complete('tap-existing', '{}')$$, 'IK003', NULL, 'RLS, no policy: idem_complete sees no key');
SELECT throws_ok($$SELECT idem_fail('tap-existing')$$, 'IK003', NULL, 'RLS, no policy: idem_fail sees no key');
SELECT ok(idem_lookup('tap-existing') IS NULL, 'RLS, no policy: idem_lookup sees no key');
SELECT is(idem_reap(), 0::bigint, 'RLS, no policy: idem_reap deletes nothing');
RESET ROLE;
CREATE POLICY regress_idem_tap_all ON idem_keys USING (true) WITH CHECK (true);
SET ROLE regress_idem_tap;
SELECT lives_ok($$SELECT idem_claim('tap-rls')$$, 'RLS with a permissive policy: idem_claim works');
SELECT is((idem_lookup('tap-existing')).state, 'failed', 'RLS with a permissive policy: idem_lookup works');
RESET ROLE;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
SELECT is((idem_lookup('tap-existing')).state, 'failed', 'RLS disabled again: idem_lookup works');

SELECT * FROM finish();
ROLLBACK;
