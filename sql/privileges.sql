--
-- Privileges (docs/contract.md §7): claim, complete and fail need SELECT, INSERT and UPDATE on
-- idem_keys, lookup SELECT, reap DELETE; otherwise 42501.  Writers in a read-only transaction:
-- 25006.  Row-level security on idem_keys is enforced.  max_key_length is superuser-only.
-- Roles are cluster-wide: all are named regress_idem_* and dropped at the end.
-- Keys of this file live in scope 'pv'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

CREATE ROLE regress_idem_none;
CREATE ROLE regress_idem_rw;         -- SELECT, INSERT, UPDATE: claim, complete, fail, lookup
CREATE ROLE regress_idem_ro;         -- SELECT: lookup
CREATE ROLE regress_idem_reaper;     -- DELETE: reap
CREATE ROLE regress_idem_no_update;  -- SELECT, INSERT
CREATE ROLE regress_idem_no_insert;  -- SELECT, UPDATE
CREATE ROLE regress_idem_no_select;  -- INSERT, UPDATE (and DELETE)
CREATE ROLE regress_idem_member IN ROLE regress_idem_rw;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO regress_idem_rw;
GRANT SELECT ON idem_keys TO regress_idem_ro;
GRANT DELETE ON idem_keys TO regress_idem_reaper;
GRANT SELECT, INSERT ON idem_keys TO regress_idem_no_update;
GRANT SELECT, UPDATE ON idem_keys TO regress_idem_no_insert;
GRANT INSERT, UPDATE, DELETE ON idem_keys TO regress_idem_no_select;

-- the install script revoked everything from PUBLIC
SELECT has_table_privilege('regress_idem_none', 'idem_keys', 'SELECT') AS public_select,
       has_table_privilege('regress_idem_none', 'idem_keys', 'INSERT') AS public_insert,
       has_table_privilege('regress_idem_none', 'idem_keys', 'UPDATE') AS public_update,
       has_table_privilege('regress_idem_none', 'idem_keys', 'DELETE') AS public_delete;

-- keys to work on, made by the superuser
SELECT outcome FROM idem_claim('pv-pending', NULL, 'pv');
SELECT outcome FROM idem_claim('pv-done', NULL, 'pv');
SELECT state FROM idem_complete('pv-done', '{"ok": true}', scope => 'pv');

-- 1. No privileges: 42501 from every function, for new and existing keys alike.
SET ROLE regress_idem_none;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-missing', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-done', 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-missing', 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
CALL pg_temp.expect_error($$SELECT idem_reap(1)$$);
RESET ROLE;

-- 2. SELECT only: lookup works, the writers and reap do not.
SET ROLE regress_idem_ro;
SELECT state, response FROM idem_lookup('pv-done', 'pv');
SELECT idem_lookup('pv-missing', 'pv') IS NULL AS no_row;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
RESET ROLE;

-- 3. Two of the three writer privileges are not enough, whatever the call would do.
SET ROLE regress_idem_no_update;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
RESET ROLE;
SET ROLE regress_idem_no_insert;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
RESET ROLE;
SET ROLE regress_idem_no_select;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-done', 'pv')$$);
RESET ROLE;
SELECT key, state, attempt FROM idem_keys WHERE scope = 'pv' ORDER BY key;

-- 4. SELECT, INSERT and UPDATE: claim, complete, fail and lookup work; reap does not.
SET ROLE regress_idem_rw;
SELECT outcome, inserted, attempt FROM idem_claim('pv-new', NULL, 'pv');
SELECT outcome, inserted, attempt FROM idem_claim('pv-new', NULL, 'pv');
SELECT state FROM idem_complete('pv-new', '{"by": "rw"}', scope => 'pv');
SELECT outcome, inserted, state, response FROM idem_claim('pv-new', NULL, 'pv');
SELECT outcome, inserted FROM idem_claim('pv-new-2', NULL, 'pv');
SELECT state, retryable FROM idem_fail('pv-new-2', scope => 'pv');
SELECT outcome, inserted, attempt FROM idem_claim('pv-new-2', NULL, 'pv');
SELECT state, response FROM idem_lookup('pv-new', 'pv');
-- errors other than privileges come through as usual
CALL pg_temp.expect_error($$SELECT idem_complete('pv-missing', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
-- non-superusers may set the default ttl and lease, not max_key_length
SET idempotency.default_ttl = '1h';
SET idempotency.default_lease = '1s';
RESET idempotency.default_ttl;
RESET idempotency.default_lease;
CALL pg_temp.expect_error($$SET idempotency.max_key_length = 10$$);
SHOW idempotency.max_key_length;
RESET ROLE;
-- privileges through role membership
SET ROLE regress_idem_member;
SELECT outcome, inserted FROM idem_claim('pv-member', NULL, 'pv');
SELECT state FROM idem_complete('pv-member', '{}', scope => 'pv');
RESET ROLE;

-- 5. DELETE only: reap works (and deletes the expired key); the rest does not.  (The SHARE
-- lock keeps a background reaper, if the library is preloaded, away from the expired key.)
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT outcome FROM idem_claim('pv-expired', NULL, 'pv', ttl => '10 ms', lease => '10 ms');
SELECT pg_sleep(0.02);
SET ROLE regress_idem_reaper;
SELECT idem_reap();
CALL pg_temp.expect_error($$SELECT idem_claim('pv-new', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-new', 'pv')$$);
RESET ROLE;
SELECT idem_lookup('pv-expired', 'pv') IS NULL AS reaped;
COMMIT;

-- 6. Read-only transaction: every writer raises 25006 (new key, existing key, missing key);
-- lookup works.
BEGIN READ ONLY;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-ro', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-pending', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-missing', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
SELECT state, response FROM idem_lookup('pv-done', 'pv');
SELECT idem_lookup('pv-ro', 'pv') IS NULL AS no_row;
COMMIT;
BEGIN;
SET TRANSACTION READ ONLY;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-ro', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
SELECT state FROM idem_lookup('pv-pending', 'pv');
COMMIT;
SET default_transaction_read_only = on;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-ro', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
SELECT state FROM idem_lookup('pv-pending', 'pv');
RESET default_transaction_read_only;
SELECT idem_lookup('pv-ro', 'pv') IS NULL AS no_row;
SELECT key, state FROM idem_keys WHERE scope = 'pv' AND key = 'pv-pending';

-- 7. Row-level security on idem_keys is enforced, never bypassed: for a role that RLS applies to,
-- the functions read and write through SQL, where the policies apply.  With RLS enabled and no
-- policy (default deny) such a role sees no key (IK003, NULL) and cannot create one (42501); the
-- reap it runs as SQL needs SELECT and UPDATE too (FOR UPDATE SKIP LOCKED).  With a permissive
-- policy everything works.  Roles that PostgreSQL exempts from RLS (superusers, BYPASSRLS) take
-- the direct path, as with plain SQL.
CREATE ROLE regress_idem_bypass BYPASSRLS;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO regress_idem_bypass;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
SET ROLE regress_idem_rw;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-rls', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('pv-done', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-done', 'pv')$$);
RESET ROLE;
SET ROLE regress_idem_reaper;
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
RESET ROLE;
CREATE POLICY regress_idem_all ON idem_keys USING (true) WITH CHECK (true);
SET ROLE regress_idem_rw;
CALL pg_temp.expect_error($$SELECT idem_claim('pv-rls', NULL, 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('pv-pending', '{}', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('pv-pending', scope => 'pv')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('pv-done', 'pv')$$);
RESET ROLE;
SET ROLE regress_idem_reaper;
CALL pg_temp.expect_error($$SELECT idem_reap()$$);
RESET ROLE;
SELECT key, state, attempt FROM idem_keys WHERE scope = 'pv' ORDER BY key;
-- exempt roles work as usual
SET ROLE regress_idem_bypass;
SELECT outcome, inserted FROM idem_claim('pv-rls', NULL, 'pv');
SELECT state FROM idem_complete('pv-rls', '{}', scope => 'pv');
SELECT state FROM idem_lookup('pv-rls', 'pv');
SELECT idem_reap();
RESET ROLE;
SELECT outcome, inserted FROM idem_claim('pv-rls-su', NULL, 'pv');
SELECT state FROM idem_fail('pv-rls-su', scope => 'pv');
SELECT state FROM idem_lookup('pv-rls-su', 'pv');
DROP POLICY regress_idem_all ON idem_keys;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
-- RLS off again: the ordinary role works again
SET ROLE regress_idem_rw;
SELECT outcome, inserted, attempt FROM idem_claim('pv-rls-su', NULL, 'pv');
RESET ROLE;

-- cleanup
DELETE FROM idem_keys WHERE scope = 'pv';
REVOKE ALL ON idem_keys FROM regress_idem_rw, regress_idem_ro, regress_idem_reaper,
    regress_idem_no_update, regress_idem_no_insert, regress_idem_no_select, regress_idem_bypass;
DROP ROLE regress_idem_member, regress_idem_none, regress_idem_rw, regress_idem_ro,
    regress_idem_reaper, regress_idem_no_update, regress_idem_no_insert, regress_idem_no_select,
    regress_idem_bypass;
