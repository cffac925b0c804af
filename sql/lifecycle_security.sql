--
-- Version 1.2's functions and view under privileges, read-only transactions and row-level
-- security: idem_extend / idem_release need SELECT and UPDATE on idem_keys, idem_forget SELECT and
-- DELETE, idem_stalled SELECT (security_invoker); the writers refuse read-only transactions
-- (25006); under row-level security each runs through SQL with the policies applied (a key the
-- policies hide does not exist for the role), including the claim of an expired key.
-- Keys of this file live in scopes 'ls-a' and 'ls-b'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

CREATE ROLE regress_idem_ls_update;   -- SELECT, UPDATE
CREATE ROLE regress_idem_ls_delete;   -- DELETE only
CREATE ROLE regress_idem_ls_forget;   -- SELECT, DELETE
CREATE ROLE regress_idem_ls_tenant;   -- everything, under a tenant policy
GRANT SELECT, UPDATE ON idem_keys TO regress_idem_ls_update;
GRANT DELETE ON idem_keys TO regress_idem_ls_delete;
GRANT SELECT, DELETE ON idem_keys TO regress_idem_ls_forget;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO regress_idem_ls_tenant;

SELECT outcome FROM idem_claim('ls-1', NULL, 'ls-a', lease => '1 hour');
SELECT outcome FROM idem_claim('ls-2', NULL, 'ls-a', lease => '1 hour');

-- 1. Privileges, as the equivalent SQL would check them.
SET ROLE regress_idem_ls_update;
SELECT attempt, locked_until > now() + interval '100 minutes' AS extended FROM idem_extend('ls-1', 1, '2 hours', 'ls-a');
SELECT state FROM idem_release('ls-2', 1, 'ls-a');
CALL pg_temp.expect_error($$SELECT idem_forget('ls-1', 'ls-a', true)$$);
CALL pg_temp.expect_error($$SELECT idem_claim('ls-1', NULL, 'ls-a')$$);
SELECT key, attempt FROM idem_stalled WHERE scope = 'ls-a';
RESET ROLE;
SET ROLE regress_idem_ls_delete;
-- DELETE ... WHERE key = ... needs SELECT too: so does idem_forget
CALL pg_temp.expect_error($$SELECT idem_forget('ls-2', 'ls-a')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('ls-1', 1, '1 hour', 'ls-a')$$);
CALL pg_temp.expect_error($$SELECT count(*) FROM idem_stalled$$);
RESET ROLE;
SET ROLE regress_idem_ls_forget;
CALL pg_temp.expect_error($$SELECT idem_release('ls-1', 1, 'ls-a')$$);
SELECT idem_forget('ls-2', 'ls-a') AS forgotten;
CALL pg_temp.expect_error($$SELECT idem_forget('ls-1', 'ls-a')$$);
RESET ROLE;
SELECT key, state, attempt FROM idem_keys WHERE scope = 'ls-a' ORDER BY key;

-- 2. Read-only transactions: the writers refuse (25006), before anything is read.
BEGIN READ ONLY;
CALL pg_temp.expect_error($$SELECT idem_extend('ls-1', 1, '1 hour', 'ls-a')$$);
CALL pg_temp.expect_error($$SELECT idem_release('ls-1', 1, 'ls-a')$$);
CALL pg_temp.expect_error($$SELECT idem_forget('ls-1', 'ls-a', true)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('ls-1', NULL, 204, 'ls-a', body => '\x00', ttl => '1 day')$$);
SELECT key FROM idem_stalled WHERE scope = 'ls-a';
COMMIT;

-- 3. Row-level security: a tenant policy on scope.  The role sees and changes only its tenant's
-- keys, through every new function and the view.
SELECT outcome FROM idem_claim('ls-b1', NULL, 'ls-b', lease => '10 ms');
SELECT outcome FROM idem_claim('ls-b2', NULL, 'ls-b', lease => '1 hour');
SELECT outcome FROM idem_claim('ls-b3', NULL, 'ls-b', ttl => '10 ms');
SELECT state FROM idem_complete('ls-b3', '{"old": true}', scope => 'ls-b');
SELECT outcome FROM idem_claim('ls-a-stalled', NULL, 'ls-a', lease => '10 ms');
SELECT pg_sleep(0.05);
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY regress_idem_ls_tenant ON idem_keys TO regress_idem_ls_tenant
    USING (scope = 'ls-b') WITH CHECK (scope = 'ls-b');
SET ROLE regress_idem_ls_tenant;
-- the other tenant's keys do not exist for this role
CALL pg_temp.expect_error($$SELECT idem_extend('ls-1', 1, '1 hour', 'ls-a')$$);
CALL pg_temp.expect_error($$SELECT idem_release('ls-1', 1, 'ls-a')$$);
SELECT idem_forget('ls-1', 'ls-a', true) AS forgotten_other_tenant;
SELECT scope, key FROM idem_stalled ORDER BY scope, key;
-- its own: extend, release, forget, the expired key claimed anew, lookup
SELECT attempt, locked_until > now() AS alive FROM idem_extend('ls-b1', 1, '1 hour', 'ls-b');
CALL pg_temp.expect_error($$SELECT idem_extend('ls-b1', 2, '1 hour', 'ls-b')$$);
SELECT state, locked_until <= clock_timestamp() AS released FROM idem_release('ls-b1', 1, 'ls-b');
SELECT outcome, inserted, attempt FROM idem_claim('ls-b1', NULL, 'ls-b');
CALL pg_temp.expect_error($$SELECT idem_forget('ls-b2', 'ls-b')$$);
SELECT idem_forget('ls-b2', 'ls-b', true) AS forced;
SELECT idem_lookup('ls-b3', 'ls-b') IS NULL AS expired_is_absent;
CALL pg_temp.expect_error($$SELECT idem_complete('ls-b3', '{}', scope => 'ls-b')$$);
SELECT outcome, inserted, attempt, response FROM idem_claim('ls-b3', '{"new": true}', 'ls-b');
SELECT state, encode(response_body, 'escape') AS body, response_headers
FROM idem_complete('ls-b3', NULL, 201, 'ls-b', body => 'tenant b', headers => '{"Location": "/b/3"}', ttl => '1 day');
SELECT outcome, encode(response_body, 'escape') AS body, response_headers FROM idem_claim('ls-b3', '{"new": true}', 'ls-b');
RESET ROLE;
DROP POLICY regress_idem_ls_tenant ON idem_keys;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
SELECT scope, key, state, attempt FROM idem_keys WHERE scope IN ('ls-a', 'ls-b') ORDER BY scope, key;

-- cleanup
DELETE FROM idem_keys WHERE scope IN ('ls-a', 'ls-b');
REVOKE ALL ON idem_keys FROM regress_idem_ls_update, regress_idem_ls_delete, regress_idem_ls_forget,
    regress_idem_ls_tenant;
DROP ROLE regress_idem_ls_update, regress_idem_ls_delete, regress_idem_ls_forget, regress_idem_ls_tenant;
