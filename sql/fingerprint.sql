--
-- Request fingerprints (docs/contract.md §3) and IK001: equivalent JSON gives one fingerprint, the scope is
-- part of it, an explicit fingerprint is stored as is, NULL is distinct from any fingerprint, and
-- the mismatch check comes before every other outcome.
-- Keys of this file live in scopes 'fp' and 'fp-b' (and key 'fp-%' in scope '').
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. The fingerprint is SHA-256(scope, 0x00, canonical jsonb text).
SELECT outcome, inserted FROM idem_claim('fp-1', '{"b": [1, 2], "a": 1, "c": {"y": null, "x": "s"}}', 'fp');
SELECT fingerprint = sha256(convert_to('fp', 'UTF8') || '\x00'::bytea
                            || convert_to('{"a": 1, "b": [1, 2], "c": {"x": "s", "y": null}}', 'UTF8'))
           AS is_sha256_of_scope_nul_jsonb,
       length(fingerprint) AS bytes
FROM idem_keys WHERE scope = 'fp' AND key = 'fp-1';
-- same with the default scope '' (the fingerprint then starts with the 0x00 byte)
-- (numbers in their shortest form: 3.0 is hashed as 3)
SELECT outcome, inserted FROM idem_claim('fp-default', '[1, "two", 3.0]');
SELECT fingerprint = sha256('\x00'::bytea || convert_to('[1, "two", 3]', 'UTF8'))
           AS is_sha256_of_nul_jsonb
FROM idem_keys WHERE scope = '' AND key = 'fp-default';
-- a scalar request: the bytes 'fp', 0x00, '"text"'
SELECT outcome, inserted FROM idem_claim('fp-scalar', '"text"', 'fp');
SELECT fingerprint = sha256('\x6670'::bytea || '\x00'::bytea || '\x227465787422'::bytea)
           AS scalar_fingerprint
FROM idem_keys WHERE scope = 'fp' AND key = 'fp-scalar';

-- 2. Equivalent JSON (key order, whitespace, duplicate keys: the last one wins in jsonb) is the
-- same request: no error.
SELECT outcome, inserted, state FROM idem_claim('fp-1', '{"c":{"x":"s","y":null},"a":1,"b":[1,2]}', 'fp');
SELECT outcome, inserted, state FROM idem_claim('fp-1', '{ "a" : 0 , "b" : [ 1 , 2 ] , "c" : { "y" : null , "x" : "s" } , "a" : 1 }', 'fp');
SELECT state FROM idem_complete('fp-1', '{"done": true}', scope => 'fp');
SELECT outcome, inserted, state, response FROM idem_claim('fp-1', '{"a":1,"c":{"y":null,"x":"s"},"b":[1,2]}', 'fp');

-- 3. A different request with the same key: IK001 (the message names the key, never the
-- request), whatever the key's state; nothing is written.
SELECT xmin AS xmin_before FROM idem_keys WHERE scope = 'fp' AND key = 'fp-1' \gset
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', '{"a": 2, "b": [1, 2], "c": {"x": "s", "y": null}}', 'fp')$$);
-- array order matters in JSON
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', '{"a": 1, "b": [2, 1], "c": {"x": "s", "y": null}}', 'fp')$$);
-- a missing member is a different request
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', '{"a": 1, "b": [1, 2]}', 'fp')$$);
-- a string "1" is not the number 1
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', '{"a": "1", "b": [1, 2], "c": {"x": "s", "y": null}}', 'fp')$$);
-- 1.0 equals 1 as jsonb, and numbers are hashed in their shortest form: the same request (1.2)
SELECT outcome, inserted FROM idem_claim('fp-1', '{"a": 1.0, "b": [1, 2.00], "c": {"x": "s", "y": null}}', 'fp');
SELECT outcome, inserted FROM idem_claim('fp-1', '{"a": 10e-1, "b": [0.1e1, 2], "c": {"x": "s", "y": null}}', 'fp');
-- a request with a secret: the error does not show it
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', '{"card": "4111111111111111"}', 'fp')$$);
SELECT xmin::text = :'xmin_before' AS row_not_written, state, attempt, response
FROM idem_keys WHERE scope = 'fp' AND key = 'fp-1';

-- 4. NULL request vs a stored fingerprint, and a request vs a stored NULL: distinct, IK001.
CALL pg_temp.expect_error($$SELECT idem_claim('fp-1', NULL, 'fp')$$);
SELECT outcome, inserted FROM idem_claim('fp-none', NULL, 'fp');
SELECT fingerprint FROM idem_keys WHERE scope = 'fp' AND key = 'fp-none';
CALL pg_temp.expect_error($$SELECT idem_claim('fp-none', '{}', 'fp')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-none', 'null', 'fp')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-none', NULL, 'fp', fingerprint => '\x00')$$);
-- NULL with NULL is not distinct: in_progress
SELECT outcome, inserted, attempt FROM idem_claim('fp-none', NULL, 'fp');
-- JSON null is a request (its fingerprint is not NULL)
SELECT outcome, inserted FROM idem_claim('fp-jsonnull', 'null', 'fp');
SELECT fingerprint IS NOT NULL AS has_fingerprint FROM idem_keys WHERE scope = 'fp' AND key = 'fp-jsonnull';
CALL pg_temp.expect_error($$SELECT idem_claim('fp-jsonnull', NULL, 'fp')$$);
SELECT outcome, inserted FROM idem_claim('fp-jsonnull', 'null', 'fp');

-- 5. The same request under two scopes gives two different fingerprints.
SELECT outcome, inserted FROM idem_claim('fp-2', '{"amount": 5}', 'fp');
SELECT outcome, inserted FROM idem_claim('fp-2', '{"amount": 5}', 'fp-b');
SELECT count(*) AS keys, count(DISTINCT fingerprint) AS fingerprints
FROM idem_keys WHERE key = 'fp-2';
SELECT bool_and(fingerprint = sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                                     || convert_to('{"amount": 5}', 'UTF8'))) AS both_sha256
FROM idem_keys WHERE key = 'fp-2';
-- the 0x00 byte separates scope and request: scope 'fpx1' with request 2 and scope 'fpx' with
-- request 12 (both "fpx12" if simply concatenated) give different fingerprints
SELECT outcome FROM idem_claim('fp-cut', '2', 'fpx1');
SELECT outcome FROM idem_claim('fp-cut', '12', 'fpx');
SELECT count(DISTINCT fingerprint) AS fingerprints,
       bool_and(fingerprint = sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                                     || convert_to(CASE scope WHEN 'fpx1' THEN '2' ELSE '12' END, 'UTF8')))
           AS both_sha256
FROM idem_keys WHERE key = 'fp-cut';

-- 6. An explicit fingerprint is stored and compared as is (it wins over request).
SELECT outcome, inserted FROM idem_claim('fp-3', NULL, 'fp', fingerprint => '\x0102');
SELECT fingerprint = '\x0102'::bytea AS stored_as_is FROM idem_keys WHERE scope = 'fp' AND key = 'fp-3';
SELECT outcome, inserted FROM idem_claim('fp-3', NULL, 'fp', fingerprint => '\x0102');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-3', NULL, 'fp', fingerprint => '\x0103')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-3', NULL, 'fp', fingerprint => '\x010200')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-3', NULL, 'fp')$$);
-- request and fingerprint both given: the fingerprint is used, the request is not hashed
SELECT outcome, inserted FROM idem_claim('fp-4', '{"x": 1}', 'fp', fingerprint => '\xaa');
SELECT fingerprint = '\xaa'::bytea AS stored_as_is FROM idem_keys WHERE scope = 'fp' AND key = 'fp-4';
SELECT outcome, inserted FROM idem_claim('fp-4', '{"x": 2}', 'fp', fingerprint => '\xaa');
SELECT outcome, inserted FROM idem_claim('fp-4', NULL, 'fp', fingerprint => '\xaa');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-4', '{"x": 1}', 'fp')$$);
-- a fingerprint given explicitly equal to the computed one matches a request-based claim
SELECT outcome, inserted FROM idem_claim('fp-5', '{"k": "v"}', 'fp');
SELECT outcome, inserted
FROM idem_claim('fp-5', NULL, 'fp',
                fingerprint => sha256(convert_to('fp', 'UTF8') || '\x00'::bytea
                                      || convert_to('{"k": "v"}', 'UTF8')));
-- 1 and 64 bytes are accepted; 0 and 65 are 22023
SELECT outcome, inserted FROM idem_claim('fp-6', NULL, 'fp', fingerprint => '\xff');
SELECT outcome, inserted FROM idem_claim('fp-7', NULL, 'fp', fingerprint => decode(repeat('ab', 64), 'hex'));
SELECT key, length(fingerprint) AS bytes FROM idem_keys
WHERE scope = 'fp' AND key IN ('fp-6', 'fp-7') ORDER BY key;
CALL pg_temp.expect_error($$SELECT idem_claim('fp-8', NULL, 'fp', fingerprint => '\x')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-8', NULL, 'fp', fingerprint => decode(repeat('ab', 65), 'hex'))$$);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-8', '{}', 'fp', fingerprint => '\x')$$);
-- the length check comes before the key is read: also for an existing key
CALL pg_temp.expect_error($$SELECT idem_claim('fp-6', NULL, 'fp', fingerprint => decode(repeat('ff', 65), 'hex'))$$);
SELECT count(*) AS keys FROM idem_keys WHERE scope = 'fp' AND key = 'fp-8';

-- 7. The fingerprint check comes first: before in_progress, replay and takeover.
-- pending, live lease: IK001, not in_progress
SELECT outcome FROM idem_claim('fp-order-1', '{"v": 1}', 'fp');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-order-1', '{"v": 2}', 'fp')$$);
-- pending, expired lease: IK001, no takeover (attempt stays 1)
SELECT outcome FROM idem_claim('fp-order-2', '{"v": 1}', 'fp', lease => '10 ms');
SELECT pg_sleep(0.05);
CALL pg_temp.expect_error($$SELECT idem_claim('fp-order-2', '{"v": 2}', 'fp')$$);
SELECT state, attempt FROM idem_keys WHERE scope = 'fp' AND key = 'fp-order-2';
-- the same request takes it over
SELECT outcome, inserted, attempt FROM idem_claim('fp-order-2', '{"v": 1}', 'fp');
-- failed (retryable): IK001, no takeover
SELECT state FROM idem_fail('fp-order-2', scope => 'fp');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-order-2', '{"v": 2}', 'fp')$$);
SELECT state, attempt FROM idem_keys WHERE scope = 'fp' AND key = 'fp-order-2';
-- the fingerprint survives takeovers: still the first request's
SELECT outcome, attempt FROM idem_claim('fp-order-2', '{"v": 1}', 'fp');
SELECT fingerprint = sha256(convert_to('fp', 'UTF8') || '\x00'::bytea || convert_to('{"v": 1}', 'UTF8'))
           AS first_fingerprint_kept
FROM idem_keys WHERE scope = 'fp' AND key = 'fp-order-2';
-- failed (not retryable) and succeeded: IK001, not replay
SELECT state FROM idem_fail('fp-order-2', NULL, 400, false, 'fp');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-order-2', '{"v": 2}', 'fp')$$);
SELECT state FROM idem_complete('fp-order-1', '{}', scope => 'fp');
CALL pg_temp.expect_error($$SELECT idem_claim('fp-order-1', '{"v": 2}', 'fp')$$);
-- complete and fail do not look at fingerprints
SELECT outcome FROM idem_claim('fp-order-3', '{"v": 1}', 'fp');
SELECT state FROM idem_complete('fp-order-3', '{"v": 99}', scope => 'fp');

-- 8. The hash itself agrees with PostgreSQL's sha256() for every message length from 5 to 265
-- bytes (the 55-, 56- and 64-byte edges of SHA-256's padding and blocks included), multi-byte
-- UTF-8, and a request of a megabyte (thousands of blocks, the scope's partial block first).
SELECT count(*) AS claimed
FROM generate_series(0, 260) n,
     idem_claim('fp-len-' || n, to_jsonb(repeat('x', n)), 'fp') c
WHERE c.outcome = 'claimed';
SELECT count(*) AS keys,
       count(*) FILTER (WHERE fingerprint = sha256(convert_to('fp', 'UTF8') || '\x00'::bytea
                                                   || convert_to(to_jsonb(repeat('x', substr(key, 8)::int))::text, 'UTF8')))
           AS sha256_agrees
FROM idem_keys WHERE scope = 'fp' AND key LIKE 'fp-len-%';
SELECT outcome FROM idem_claim('fp-utf8', '{"name": "Zoë ✓ 😀", "note": "ünïcödé"}', 'fp-b');
SELECT outcome FROM idem_claim('fp-long', jsonb_build_object('blob', repeat('0123456789', 100000)), 'fpx1');
SELECT key, fingerprint = sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                                 || convert_to(CASE key WHEN 'fp-utf8' THEN '{"name": "Zoë ✓ 😀", "note": "ünïcödé"}'::jsonb
                                                        ELSE jsonb_build_object('blob', repeat('0123456789', 100000)) END::text, 'UTF8'))
           AS sha256_agrees
FROM idem_keys WHERE key IN ('fp-utf8', 'fp-long') ORDER BY key;

-- 9. The canonical text is jsonb's text form byte for byte: every control character escaped,
-- quotes and backslashes in keys and values, nesting, empty containers, scalars at the top level,
-- long and negative numbers, non-ASCII text; numbers with trailing fraction zeros at any depth
-- are written trimmed.
CREATE TEMP TABLE fp_corpus (n int, request jsonb, canonical text);
INSERT INTO fp_corpus (n, request) VALUES
  (1, jsonb_build_array((SELECT string_agg(chr(i), '' ORDER BY i) FROM generate_series(1, 31) i))),
  (2, jsonb_build_object(E'k\n"\\/', E'v\t"x"\\', E'\u0001', E'\u001f')),
  (3, '{"a": [], "b": {}, "c": [[], {}, [1, [2, {"d": null}]]], "e": true, "f": false}'),
  (4, 'true'), (5, 'false'), (6, 'null'), (7, '-0.5'), (8, '""'), (9, '[""]'), (10, '{"": ""}'),
  (11, '12345678901234567890.123456789'), (12, '1e40'), (13, '-7e-5'),
  (14, '"é 😀 \u007f ✓"'), (15, '[1, "a", null, true, {"x": [false, {"y": "z"}]}]'),
  (16, '{"z": 1, "a": {"m": [3, 2, 1], "b": "\\u0041"}}'), (17, '[[[[[]]]]]'), (18, '{}'), (19, '[]');
UPDATE fp_corpus SET canonical = request::text;
INSERT INTO fp_corpus VALUES
  (20, '[1.50, {"a": 2.000, "b": [0.10, -3.0]}, 100, 1e2, 1.0e-2]', '[1.5, {"a": 2, "b": [0.1, -3]}, 100, 100, 0.01]'),
  (21, '{"k": 10.0}', '{"k": 10}');
SELECT count(*) AS claimed
FROM fp_corpus, idem_claim('fp-c-' || n, request, 'fp') c WHERE c.outcome = 'claimed';
SELECT count(*) AS keys,
       count(*) FILTER (WHERE fingerprint = sha256(convert_to('fp', 'UTF8') || '\x00'::bytea
                                                   || convert_to(canonical, 'UTF8'))) AS sha256_agrees,
       string_agg(n::text, ', ') FILTER (WHERE fingerprint <> sha256(convert_to('fp', 'UTF8') || '\x00'::bytea
                                                                      || convert_to(canonical, 'UTF8'))) AS disagree
FROM fp_corpus JOIN idem_keys ON scope = 'fp' AND key = 'fp-c-' || n;
-- and each request is recognised as itself
SELECT count(*) FILTER (WHERE c.outcome = 'in_progress') AS in_progress
FROM fp_corpus, idem_claim('fp-c-' || n, request, 'fp') c;

DELETE FROM idem_keys WHERE scope IN ('fp', 'fp-b', 'fpx', 'fpx1') OR (scope = '' AND key LIKE 'fp-%');
