--
-- The extension as a whole (docs/contract.md §1, §2): catalog properties of the API, DROP and CREATE
-- EXTENSION in one session, and an extension schema other than public: the functions find
-- their table through the extension's schema, never through search_path.
-- Named zz_ so that it runs last; it leaves the extension installed in public as it found it.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. Catalog: every routine VOLATILE, none STRICT, none SECURITY DEFINER.
SELECT p.proname, p.prokind, p.provolatile, p.proisstrict, p.prosecdef,
       pg_get_function_identity_arguments(p.oid) AS arguments
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_lookup', 'idem_reap',
                    'idem_reap_all')
ORDER BY p.proname;
SELECT extversion, extrelocatable, extnamespace::regnamespace AS schema,
       'idem_keys'::regclass = ANY (extconfig) AS keys_are_dumped
FROM pg_extension WHERE extname = 'idempotency';
-- the documented columns, in order (more may follow)
SELECT attnum, attname, format_type(atttypid, atttypmod) AS type, attnotnull
FROM pg_attribute
WHERE attrelid = 'idem_keys'::regclass AND attnum BETWEEN 1 AND 12 AND NOT attisdropped
ORDER BY attnum;
SELECT conname, contype, pg_get_constraintdef(oid) AS definition
FROM pg_constraint WHERE conrelid = 'idem_keys'::regclass AND contype = 'p';
-- PUBLIC has no privilege on the table
SELECT count(*) AS public_grants
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'idem_keys'::regclass AND a.grantee = 0;
-- not relocatable
CALL pg_temp.expect_error($$ALTER EXTENSION idempotency SET SCHEMA pg_catalog$$);

-- 2. DROP EXTENSION and CREATE EXTENSION in the same session: the functions keep working on
-- the new table (nothing cached from the old one).
SELECT outcome, inserted, attempt FROM idem_claim('ext-1', '{"n": 1}', 'ext');
SELECT state FROM idem_complete('ext-1', '{"v": 1}', scope => 'ext');
SELECT outcome, inserted, response FROM idem_claim('ext-1', '{"n": 1}', 'ext');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
-- a new, empty table: the key is new again
SELECT count(*) AS keys FROM idem_keys;
SELECT outcome, inserted, attempt FROM idem_claim('ext-1', '{"n": 1}', 'ext');
SELECT outcome, inserted, attempt FROM idem_claim('ext-1', '{"n": 1}', 'ext');
SELECT state FROM idem_complete('ext-1', '{"v": 2}', scope => 'ext');
SELECT state, response FROM idem_lookup('ext-1', 'ext');
SELECT outcome, inserted, response FROM idem_claim('ext-1', '{"n": 1}', 'ext');
CALL pg_temp.expect_error($$SELECT idem_claim('ext-1', '{"n": 2}', 'ext')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('ext-1', '{}', scope => 'ext')$$);
-- (the SHARE lock keeps a background reaper, if the library is preloaded, away from ext-2)
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT outcome FROM idem_claim('ext-2', NULL, 'ext', ttl => '10 ms', lease => '10 ms');
SELECT pg_sleep(0.02);
SELECT idem_reap();
COMMIT;
SELECT key FROM idem_keys ORDER BY key;
-- and once more, within one transaction
BEGIN;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT outcome, inserted, attempt FROM idem_claim('ext-1', '{"n": 1}', 'ext');
SELECT state FROM idem_complete('ext-1', '{"v": 3}', scope => 'ext');
COMMIT;
SELECT state, response FROM idem_lookup('ext-1', 'ext');
-- a rolled back DROP EXTENSION leaves the old table in use
BEGIN;
DROP EXTENSION idempotency;
ROLLBACK;
SELECT outcome, inserted, response FROM idem_claim('ext-1', '{"n": 1}', 'ext');

-- 3. The extension in another schema, with a decoy public.idem_keys of the same shape first
-- on search_path: every function uses the extension's own table.
DROP EXTENSION idempotency;
CREATE SCHEMA regress_idem_s;
CREATE EXTENSION idempotency SCHEMA regress_idem_s;
SELECT extnamespace::regnamespace AS schema FROM pg_extension WHERE extname = 'idempotency';
CREATE TABLE public.idem_keys (LIKE regress_idem_s.idem_keys INCLUDING ALL);
SET search_path = public, regress_idem_s;
SELECT outcome, inserted, attempt FROM idem_claim('ext-3', '{"n": 3}', 'ext');
SELECT outcome, inserted, attempt FROM idem_claim('ext-3', '{"n": 3}', 'ext');
SELECT state, response FROM idem_complete('ext-3', '{"v": 3}', scope => 'ext');
SELECT outcome, inserted, response FROM idem_claim('ext-3', '{"n": 3}', 'ext');
SELECT outcome, inserted FROM idem_claim('ext-4', NULL, 'ext');
SELECT state, retryable FROM idem_fail('ext-4', scope => 'ext');
SELECT outcome, inserted, attempt FROM idem_claim('ext-4', NULL, 'ext');
SELECT state, response FROM idem_lookup('ext-3', 'ext');
-- a decoy row that a search_path lookup would find and a reap would delete
INSERT INTO public.idem_keys (scope, key, state, attempt, created_at, expires_at)
VALUES ('ext', 'ext-decoy', 'succeeded', 1, clock_timestamp() - interval '2 days',
        clock_timestamp() - interval '1 day');
SELECT idem_lookup('ext-decoy', 'ext') IS NULL AS decoy_not_seen;
CALL pg_temp.expect_error($$SELECT idem_complete('ext-decoy', '{}', scope => 'ext')$$);
BEGIN;
LOCK TABLE regress_idem_s.idem_keys IN SHARE MODE;
SELECT outcome FROM idem_claim('ext-5', NULL, 'ext', ttl => '10 ms', lease => '10 ms');
SELECT pg_sleep(0.02);
SELECT idem_reap();
COMMIT;
SELECT 'extension' AS tbl, key, state, attempt FROM regress_idem_s.idem_keys
UNION ALL
SELECT 'decoy', key, state, attempt FROM public.idem_keys
ORDER BY 1, 2;
-- search_path without the extension's schema (qualified calls), and an empty search_path
SET search_path = public;
SELECT outcome, inserted, attempt FROM regress_idem_s.idem_claim('ext-6', '{"n": 6}', 'ext');
SELECT state FROM regress_idem_s.idem_complete('ext-6', '{"v": 6}', scope => 'ext');
SELECT state, response FROM regress_idem_s.idem_lookup('ext-6', 'ext');
SET search_path = '';
SELECT outcome, inserted, response FROM regress_idem_s.idem_claim('ext-6', '{"n": 6}', 'ext');
CALL pg_temp.expect_error($$SELECT regress_idem_s.idem_complete('ext-6', '{}', scope => 'ext')$$);
SELECT outcome, inserted FROM regress_idem_s.idem_claim('ext-7', NULL, 'ext', ttl => '10 ms', lease => '10 ms');
SELECT pg_catalog.pg_sleep(0.015);
CALL regress_idem_s.idem_reap_all(2);
SET search_path = public, regress_idem_s;
-- the decoy table was never written: still only the row inserted above
SELECT 'extension' AS tbl, key, state, attempt FROM regress_idem_s.idem_keys
UNION ALL
SELECT 'decoy', key, state, attempt FROM public.idem_keys
ORDER BY 1, 2;
RESET search_path;

-- 4. Back to public, as the other tests expect.
DROP TABLE public.idem_keys;
DROP EXTENSION idempotency;
DROP SCHEMA regress_idem_s;
CREATE EXTENSION idempotency SCHEMA public;
SELECT outcome, inserted, attempt FROM idem_claim('ext-8', NULL, 'ext');
SELECT count(*) AS keys FROM idem_keys;
DELETE FROM idem_keys WHERE scope = 'ext';
