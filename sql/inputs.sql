--
-- Inputs (docs/contract.md §4): NULL where a value is required -> 22004 naming the
-- argument; an invalid key, scope, ttl, lease, fingerprint or max_rows -> 22023 naming it;
-- checks run in argument order before anything is read or written, so nothing changes.
-- Keys of this file: scope 'in', or keys 'in-%' in other scopes.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error
CREATE TEMP VIEW in_keys AS
SELECT * FROM idem_keys WHERE scope = 'in' OR key LIKE 'in-%';

-- 1. NULL where required: 22004 `argument "<name>" must not be null`.
CALL pg_temp.expect_error($$SELECT idem_claim(NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_claim(NULL, '{}', 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-null', '{}', NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-null', scope => NULL)$$);
-- in argument order: key before scope
CALL pg_temp.expect_error($$SELECT idem_claim(NULL, NULL, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_complete(NULL, '{}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-null', NULL, 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-null', '{}', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-null', '{}', 200, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_complete(NULL, NULL, NULL, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-null', NULL, NULL, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_fail(NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-null', '{}', NULL, true, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-null', '{}', 500, NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-null', '{}', 500, true, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-null', NULL, NULL, NULL, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_lookup(NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('in-null', NULL)$$);
SELECT count(*) AS keys FROM in_keys;

-- NULL for an optional argument means "not given": defaults apply
SELECT outcome, inserted, attempt FROM idem_claim('in-1', NULL, 'in', NULL, NULL, NULL);
SELECT fingerprint, expires_at BETWEEN created_at + interval '86399 s'
                                  AND created_at + interval '86401 s' AS default_ttl,
       locked_until - created_at BETWEEN interval '59 s' AND interval '61 s' AS default_lease
FROM idem_keys WHERE scope = 'in' AND key = 'in-1';
-- a NULL response is fine for fail; attempt NULL means no fencing
SELECT state, response, response_code, retryable FROM idem_fail('in-1', NULL, 500, true, 'in', NULL);
SELECT outcome, attempt FROM idem_claim('in-1', NULL, 'in');
SELECT state, attempt FROM idem_complete('in-1', '{}', 200, 'in', NULL);
-- required arguments are checked before the key is read: 22004, not IK003 / IK004
CALL pg_temp.expect_error($$SELECT idem_complete('in-missing', '{}', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-1', '{}', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-1', '{}', 500, NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-missing', '{}', NULL, true, 'in')$$);
SELECT key, state, attempt, response FROM in_keys ORDER BY key;

-- 2. key: 1..max_key_length (255) characters, each printable ASCII 0x20-0x7E; else 22023.
CALL pg_temp.expect_error($$SELECT idem_claim('', NULL, 'in')$$);
SELECT outcome, inserted FROM idem_claim(repeat('k', 255), NULL, 'in');
CALL pg_temp.expect_error($$SELECT idem_claim(repeat('k', 256), NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim(repeat('k', 1000), NULL, 'in')$$);
-- every printable ASCII character, space and '~' included, is accepted and stored as is
SELECT outcome, inserted FROM idem_claim(' ', NULL, 'in');
SELECT outcome, inserted FROM idem_claim('~', NULL, 'in');
SELECT outcome, inserted
FROM idem_claim((SELECT string_agg(chr(c), '' ORDER BY c) FROM generate_series(32, 126) c), NULL, 'in');
SELECT key FROM idem_keys WHERE scope = 'in' AND length(key) = 95;
SELECT outcome, inserted FROM idem_claim(' in-spaces ', NULL, 'in');
SELECT outcome, inserted FROM idem_claim('in-spaces', NULL, 'in');
-- control characters and DEL: 22023, the DETAIL gives the byte position
CALL pg_temp.expect_error($$SELECT idem_claim(E'ab\tc', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim(E'\n', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('abc' || chr(1), NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('abc' || chr(31), NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('x' || chr(127), NULL, 'in')$$);
-- the same checks for every function that takes a key
CALL pg_temp.expect_error($$SELECT idem_complete('', '{}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete(repeat('k', 256), '{}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail(E'a\tb', scope => 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('', 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup(E'a\rb', 'in')$$);
-- a bad key is reported before a NULL later argument (argument order)
CALL pg_temp.expect_error($$SELECT idem_claim('', NULL, NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_complete(E'\t', NULL, 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('', NULL, NULL, NULL, NULL)$$);
SELECT count(*) AS keys FROM in_keys;

-- idempotency.max_key_length (superuser, 1..2000) moves the limit for every function
SET idempotency.max_key_length = 10;
SHOW idempotency.max_key_length;
SELECT outcome, inserted FROM idem_claim('in-4567890', NULL, 'in');
CALL pg_temp.expect_error($$SELECT idem_claim('in-45678901', NULL, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-45678901', '{}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-45678901', scope => 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('in-45678901', 'in')$$);
-- an existing key longer than the new limit is refused too
CALL pg_temp.expect_error($$SELECT idem_claim(repeat('k', 255), NULL, 'in')$$);
SET idempotency.max_key_length = 1;
SELECT outcome, inserted FROM idem_claim('x', NULL, 'in');
CALL pg_temp.expect_error($$SELECT idem_claim('xy', NULL, 'in')$$);
CALL pg_temp.expect_error($$SET idempotency.max_key_length = 0$$);
CALL pg_temp.expect_error($$SET idempotency.max_key_length = 2001$$);
SET idempotency.max_key_length = 2000;
SELECT outcome, inserted FROM idem_claim(repeat('L', 2000), NULL, 'in');
CALL pg_temp.expect_error($$SELECT idem_claim(repeat('L', 2001), NULL, 'in')$$);
RESET idempotency.max_key_length;
SHOW idempotency.max_key_length;
CALL pg_temp.expect_error($$SELECT idem_claim(repeat('L', 256), NULL, 'in')$$);
SELECT count(*) AS keys FROM in_keys;

-- 3. scope: any text of at most 255 bytes ('' included); else 22023.
SELECT outcome, inserted FROM idem_claim('in-scope-1', NULL, repeat('s', 255));
CALL pg_temp.expect_error($$SELECT idem_claim('in-scope-1', NULL, repeat('s', 256))$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-scope-1', '{}', 200, repeat('s', 256))$$);
CALL pg_temp.expect_error($$SELECT idem_fail('in-scope-1', scope => repeat('s', 256))$$);
CALL pg_temp.expect_error($$SELECT idem_lookup('in-scope-1', repeat('s', 256))$$);
SELECT outcome, inserted FROM idem_claim('in-scope-2', NULL, '');
SELECT outcome, inserted FROM idem_claim('in-scope-3', NULL, E'tab\tand space');
SELECT length(scope) AS scope_length FROM idem_keys WHERE key LIKE 'in-scope-%' ORDER BY key;
-- argument order: key, then scope
CALL pg_temp.expect_error($$SELECT idem_claim('', NULL, repeat('s', 256))$$);
SELECT count(*) AS keys FROM in_keys;

-- 4. ttl and lease: positive, at most 100 years; else 22023 (checked on every claim, also when
-- they would not be used).
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', ttl => '0')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', ttl => '-1 s')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', ttl => '1 day -25 hours')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', ttl => '100 years 1 day')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', ttl => '1000000 hours')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', lease => '0')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', lease => '-5 minutes')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', lease => '101 years')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', lease => '100 years 00:00:00.000001')$$);
-- an existing (finished) key: still checked, no replay
CALL pg_temp.expect_error($$SELECT idem_claim('in-1', NULL, 'in', ttl => '0')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-1', NULL, 'in', lease => '-1 s')$$);
-- argument order: scope, ttl, lease, fingerprint
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, repeat('s', 256), '0', '0', '\x')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', '0', '0', '\x')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', '1 s', '0', '\x')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('in-2', NULL, 'in', '1 s', '1 s', '\x')$$);
SELECT count(*) AS keys FROM in_keys;
-- the bounds themselves are accepted
SELECT outcome, inserted FROM idem_claim('in-2', NULL, 'in', ttl => '100 years', lease => '100 years');
-- (in-3's lease and in-3b's ttl are long so that a background reaper cannot remove either)
SELECT outcome, inserted FROM idem_claim('in-3', NULL, 'in', ttl => '1 microsecond', lease => '1 hour');
SELECT outcome, inserted FROM idem_claim('in-3b', NULL, 'in', ttl => '1 hour', lease => '1 microsecond');
SELECT key, expires_at = created_at + interval '100 years' AS ttl_100_years,
       locked_until = created_at + interval '100 years' AS lease_100_years,
       expires_at = created_at + interval '1 microsecond' AS ttl_1us,
       locked_until = created_at + interval '1 microsecond' AS lease_1us
FROM idem_keys WHERE scope = 'in' AND key IN ('in-2', 'in-3', 'in-3b') ORDER BY key;
-- 1200 months = 100 years; 36000 days is not more than 100 years either: accepted
SELECT outcome, inserted FROM idem_claim('in-4', NULL, 'in', ttl => '1200 mons', lease => '36000 days');

-- 5. max_rows: at least 1 (NULL means the default), else 22023; idem_reap_all's batch_size too.
CALL pg_temp.expect_error($$SELECT idem_reap(0)$$);
CALL pg_temp.expect_error($$SELECT idem_reap(-1)$$);
CALL pg_temp.expect_error($$CALL idem_reap_all(0)$$);
SELECT idem_reap(NULL) >= 0 AS default_max_rows;
SELECT count(*) AS keys FROM in_keys;

-- 6. No error message names a request or response body.
SELECT outcome FROM idem_claim('in-5', '{"secret": "s3cr3t-request"}', 'in');
CALL pg_temp.expect_error($$SELECT idem_claim('in-5', '{"secret": "s3cr3t-other"}', 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('', '{"secret": "s3cr3t-response"}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-5', '{"secret": "s3cr3t-response"}', 200, 'in', 2)$$);
SELECT state FROM idem_complete('in-5', '{"secret": "s3cr3t-response"}', 200, 'in');
CALL pg_temp.expect_error($$SELECT idem_fail('in-5', '{"secret": "s3cr3t-response"}', 500, true, 'in')$$);

-- keys are printed literally in messages, format characters, quotes and backslashes included
SELECT outcome, inserted FROM idem_claim('in-%s%d%n%%', '{"a": 1}', 'in');
CALL pg_temp.expect_error($$SELECT idem_claim('in-%s%d%n%%', '{"a": 2}', 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-%s%d%n%%-missing', '{}', 200, 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-%s%d%n%%', '{}', 200, 'in', 7)$$);
SELECT state FROM idem_complete('in-%s%d%n%%', '{}', 200, 'in');
CALL pg_temp.expect_error($$SELECT idem_fail('in-%s%d%n%%', scope => 'in')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('in-"quoted"\back''tick`', '{}', 200, 'in')$$);

-- 7. The settings' prefix is reserved.
CALL pg_temp.expect_error($$SET idempotency.no_such_setting = 1$$);

DELETE FROM idem_keys WHERE scope = 'in' OR key LIKE 'in-%';
DROP VIEW in_keys;

-- 8. Scope length is in bytes, not characters; keys must be ASCII even when the database
-- encoding has more.  Run in a UTF8 database so that this does not depend on the encoding of
-- the test database.
SELECT current_database() AS regress_database \gset
CREATE DATABASE regress_idem_utf8 TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C';
\c regress_idem_utf8
\pset null '(null)'
CREATE EXTENSION idempotency;
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error
-- 127 two-byte characters = 254 bytes: accepted; 128 = 256 bytes: 22023 (128 characters only)
SELECT outcome, inserted FROM idem_claim('in-utf8-1', NULL, repeat(U&'\00E9', 127));
CALL pg_temp.expect_error($$SELECT idem_claim('in-utf8-1', NULL, repeat(U&'\00E9', 128))$$);
-- 85 three-byte characters = 255 bytes: accepted
SELECT outcome, inserted FROM idem_claim('in-utf8-2', NULL, repeat(U&'\20AC', 85));
CALL pg_temp.expect_error($$SELECT idem_claim('in-utf8-2', NULL, 'x' || repeat(U&'\20AC', 85))$$);
SELECT key, length(scope) AS characters, octet_length(scope) AS bytes FROM idem_keys ORDER BY key;
-- the fingerprint hashes the scope's bytes
SELECT outcome, inserted FROM idem_claim('in-utf8-3', '{"a": "b"}', U&'caf\00E9');
SELECT fingerprint = sha256('\x636166c3a900'::bytea || convert_to('{"a": "b"}', 'UTF8')) AS utf8_scope_bytes
FROM idem_keys WHERE key = 'in-utf8-3';
-- non-ASCII characters in a key: 22023 (the DETAIL gives the byte position)
CALL pg_temp.expect_error($$SELECT idem_claim(U&'ab\00E9c')$$);
CALL pg_temp.expect_error($$SELECT idem_claim(U&'\20AC')$$);
CALL pg_temp.expect_error($$SELECT idem_lookup(U&'ab\00E9c')$$);
SELECT count(*) AS keys FROM idem_keys;
\c :regress_database
-- FORCE: a background reaper (library preloaded) may be connected to it
DROP DATABASE regress_idem_utf8 WITH (FORCE);
