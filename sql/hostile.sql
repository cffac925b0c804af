--
-- Hostile and bad input (issue 5): a matrix of bad inputs across every function. Each one gets
-- its documented SQLSTATE (docs/errors.md, docs/api.md "Argument rules"), or is a documented "not
-- given", or is stored and replayed intact.  After every error the helper asserts that idem_keys
-- did not change (a checksum over every row's ctid, xmin and columns: not even a new row version
-- was written) and, for argument errors (22004, 22023), that the idem_stats counters did not move.
-- The backend staying up is asserted by the session's pid never changing (a crash would also make
-- every later line of this file fail), and by a SELECT 1 after each section.
-- Cases are numbered [n]; the count is checked at the end.
--
-- Runs in its own UTF8 database: the non-ASCII cases must not depend on the encoding of the test
-- database, and the checksum must cover only this file's keys.
--
SELECT current_database() AS regress_database \gset
CREATE DATABASE regress_idem_hostile TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C';
\c regress_idem_hostile
\pset null '(null)'
CREATE EXTENSION idempotency;
SELECT pg_backend_pid() AS hostile_pid \gset
SET client_min_messages = notice;

-- A checksum of every row, physical position and inserting transaction included.
CREATE FUNCTION pg_temp.rows_sum() RETURNS text LANGUAGE sql AS $$
    SELECT count(*) || ' rows ' || coalesce(md5(string_agg(
               md5(k.ctid::text || ' ' || k.xmin::text || ' ' || k::text), '' ORDER BY k.scope, k.key)), '-')
    FROM idem_keys k
$$;
-- The request counters of idem_stats (all NULL when the library is not preloaded).
CREATE FUNCTION pg_temp.counters() RETURNS text LANGUAGE sql AS $$
    SELECT row(claims, inserted, replays, in_progress, takeovers, mismatches, completes, fails)::text
    FROM idem_stats
$$;
-- bad(n, sql): runs case n's statement in a subtransaction and reports "[n] SQLSTATE: message"
-- (with DETAIL and HINT), or "[n] no error", then whether idem_keys and the counters changed.
CREATE TEMP TABLE hx_cases (n integer PRIMARY KEY);
CREATE PROCEDURE pg_temp.bad(n integer, sql text)
LANGUAGE plpgsql AS $proc$
DECLARE
    rows_before     text := pg_temp.rows_sum();
    counters_before text := pg_temp.counters();
    code text;
    msg  text;
    det  text;
    hnt  text;
    line text;
BEGIN
    INSERT INTO hx_cases VALUES (n);
    BEGIN
        EXECUTE sql;
        line := format('[%s] no error', n);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
        line := format('[%s] %s: %s', n, code, msg);
    END;
    IF pg_temp.rows_sum() IS NOT DISTINCT FROM rows_before THEN
        line := line || ' | idem_keys unchanged';
    ELSE
        line := line || ' | IDEM_KEYS CHANGED';
    END IF;
    IF code IN ('22004', '22023') THEN
        IF pg_temp.counters() IS NOT DISTINCT FROM counters_before THEN
            line := line || ' | counters unchanged';
        ELSE
            line := line || ' | COUNTERS CHANGED';
        END IF;
    END IF;
    IF det <> '' AND hnt <> '' THEN
        RAISE NOTICE '%', line USING DETAIL = det, HINT = hnt;
    ELSIF det <> '' THEN
        RAISE NOTICE '%', line USING DETAIL = det;
    ELSIF hnt <> '' THEN
        RAISE NOTICE '%', line USING HINT = hnt;
    ELSE
        RAISE NOTICE '%', line;
    END IF;
END
$proc$;
-- ok(n): records a case whose outcome is shown by the query that follows it.
CREATE PROCEDURE pg_temp.ok(n integer) LANGUAGE sql AS $$ INSERT INTO hx_cases VALUES (n) $$;

-- keys to act on: pending, succeeded, failed (not retryable)
SELECT outcome FROM idem_claim('hx-pending', '{"r": 1}', 'hx');
SELECT outcome FROM idem_claim('hx-done', '{"r": 1}', 'hx');
SELECT state FROM idem_complete('hx-done', '{"ok": true}', 201, 'hx');
SELECT outcome FROM idem_claim('hx-failed', '{"r": 1}', 'hx');
SELECT state FROM idem_fail('hx-failed', '{"error": "final"}', 422, false, 'hx');

--
-- 1. NULL in every argument of every function.
--    Required (22004, naming the argument): key and scope everywhere; response and
--    response_code for idem_complete; response_code and retryable for idem_fail; schedule.
--    Not given: request, ttl, lease, fingerprint, attempt, max_rows, batch_size, reaped, and
--    idem_fail's response (stored as NULL).
--
CALL pg_temp.bad(1, $$SELECT idem_claim(NULL, '{}', 'hx')$$);
CALL pg_temp.bad(2, $$SELECT idem_claim('hx-pending', '{}', NULL)$$);
CALL pg_temp.bad(3, $$SELECT idem_claim(NULL, NULL, NULL, NULL, NULL, NULL)$$);
CALL pg_temp.bad(4, $$SELECT idem_complete(NULL, '{}', 200, 'hx', 1)$$);
CALL pg_temp.bad(5, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', 1, headers => '["Location"]')$$);
CALL pg_temp.bad(6, $$SELECT idem_complete('hx-pending', '{}', NULL, 'hx', 1)$$);
CALL pg_temp.bad(7, $$SELECT idem_complete('hx-pending', '{}', 200, NULL, 1)$$);
CALL pg_temp.bad(8, $$SELECT idem_fail(NULL, '{}', 500, true, 'hx', 1)$$);
CALL pg_temp.bad(9, $$SELECT idem_fail('hx-pending', '{}', NULL, true, 'hx', 1)$$);
CALL pg_temp.bad(10, $$SELECT idem_fail('hx-pending', '{}', 500, NULL, 'hx', 1)$$);
CALL pg_temp.bad(11, $$SELECT idem_fail('hx-pending', '{}', 500, true, NULL, 1)$$);
CALL pg_temp.bad(12, $$SELECT idem_lookup(NULL, 'hx')$$);
CALL pg_temp.bad(13, $$SELECT idem_lookup('hx-done', NULL)$$);
CALL pg_temp.bad(14, $$SELECT idem_schedule_reaper(NULL)$$);
-- the NULL-typed (unknown) forms resolve to the same functions
CALL pg_temp.bad(15, $$SELECT idem_lookup(NULL::text, NULL::text)$$);
-- NULL where the argument is optional: the defaults apply
CALL pg_temp.ok(16);
SELECT outcome, inserted, attempt FROM idem_claim('hx-nulls', NULL, 'hx', NULL, NULL, NULL);
SELECT fingerprint, locked_until - created_at BETWEEN '59 s' AND '61 s' AS default_lease,
       expires_at - created_at BETWEEN '86399 s' AND '86401 s' AS default_ttl
FROM idem_keys WHERE scope = 'hx' AND key = 'hx-nulls';
CALL pg_temp.ok(17);   -- idem_fail: response NULL is stored as NULL; attempt NULL: no fencing
SELECT state, response, response_code, retryable FROM idem_fail('hx-nulls', NULL, 503, true, 'hx', NULL);
CALL pg_temp.ok(18);   -- idem_complete: attempt NULL, no fencing (after a takeover)
SELECT outcome, attempt FROM idem_claim('hx-nulls', NULL, 'hx');
SELECT state, attempt FROM idem_complete('hx-nulls', '{}', 200, 'hx', NULL);
CALL pg_temp.ok(19);   -- idem_reap(NULL): the batch-size setting; nothing here is expired
SELECT idem_reap(NULL);
CALL pg_temp.ok(20);
CALL idem_reap_all(NULL, NULL);
SELECT 1 AS backend_up;

--
-- 2. Keys: empty, over-long, non-ASCII and control characters (22023; the printable-ASCII check
--    comes first and its DETAIL gives the 1-based byte position and value).
--
CALL pg_temp.bad(21, $$SELECT idem_claim('', NULL, 'hx')$$);
CALL pg_temp.bad(22, $$SELECT idem_claim(repeat('k', 256), NULL, 'hx')$$);
CALL pg_temp.bad(23, $$SELECT idem_claim(repeat('k', 1000000), NULL, 'hx')$$);
CALL pg_temp.bad(24, $$SELECT idem_claim(U&'caf\00E9', NULL, 'hx')$$);          -- é precomposed
CALL pg_temp.bad(25, $$SELECT idem_claim(U&'cafe\0301', NULL, 'hx')$$);         -- e + combining acute
CALL pg_temp.bad(26, $$SELECT idem_claim(U&'\+01F600', NULL, 'hx')$$);          -- 4-byte emoji
CALL pg_temp.bad(27, $$SELECT idem_claim(U&'\200Bhx-pending', NULL, 'hx')$$);   -- zero-width space
CALL pg_temp.bad(28, $$SELECT idem_claim(U&'hx\00A0pending', NULL, 'hx')$$);    -- no-break space
CALL pg_temp.bad(29, $$SELECT idem_claim(U&'\FEFFhx-pending', NULL, 'hx')$$);   -- byte order mark
CALL pg_temp.bad(30, $$SELECT idem_claim(E'hx-pending\n', NULL, 'hx')$$);       -- trailing newline
CALL pg_temp.bad(31, $$SELECT idem_claim(E'hx\tpending', NULL, 'hx')$$);
CALL pg_temp.bad(32, $$SELECT idem_claim(E'hx\rpending', NULL, 'hx')$$);
CALL pg_temp.bad(33, $$SELECT idem_claim(E'hx\x1b[31mpending', NULL, 'hx')$$);  -- ANSI escape
CALL pg_temp.bad(34, $$SELECT idem_claim('hx-pending' || chr(127), NULL, 'hx')$$);
CALL pg_temp.bad(35, $$SELECT idem_claim(E'\x01', NULL, 'hx')$$);
-- non-ASCII and too long: the character check is reported
CALL pg_temp.bad(36, $$SELECT idem_claim(repeat(U&'\00E9', 300), NULL, 'hx')$$);
-- every function that takes a key
CALL pg_temp.bad(37, $$SELECT idem_complete(U&'hx-pend\0131ng', '{}', 200, 'hx')$$);  -- dotless i
CALL pg_temp.bad(38, $$SELECT idem_fail(E'hx-pending\x0b', scope => 'hx')$$);
CALL pg_temp.bad(39, $$SELECT idem_lookup(U&'hx-d\043Ene', 'hx')$$);                  -- Cyrillic o
CALL pg_temp.bad(40, $$SELECT idem_complete(repeat('k', 256), '{}', 200, 'hx')$$);
CALL pg_temp.bad(41, $$SELECT idem_lookup(repeat('k', 100000), 'hx')$$);
-- PostgreSQL itself refuses NUL and invalid UTF-8 before the function runs
CALL pg_temp.bad(42, $$SELECT idem_claim('hx' || chr(0), NULL, 'hx')$$);
CALL pg_temp.bad(43, $$SELECT idem_claim(convert_from('\x68c3'::bytea, 'UTF8'), NULL, 'hx')$$);
-- no implicit cast to text: a non-text key finds no function
CALL pg_temp.bad(44, $$SELECT idem_claim(42)$$);
-- printable ASCII that looks hostile is a valid key, stored and named literally
CALL pg_temp.ok(45);
SELECT outcome, inserted FROM idem_claim($$'); DROP TABLE idem_keys; --$$, '{"a": 1}', 'hx');
CALL pg_temp.bad(46, $k$SELECT idem_claim($$'); DROP TABLE idem_keys; --$$, '{"a": 2}', 'hx')$k$);
SELECT key FROM idem_keys WHERE scope = 'hx' AND key LIKE '%DROP%';
SELECT 1 AS backend_up;

--
-- 3. Scopes: NULL (above), over-long (22023, in bytes), and odd bytes, which are accepted: any
--    text of at most 255 bytes is a scope, stored and compared byte for byte (no normalisation:
--    'é' precomposed and 'e' + combining acute are two scopes).
--
CALL pg_temp.bad(47, $$SELECT idem_claim('hx-odd', NULL, repeat('s', 256))$$);
CALL pg_temp.bad(48, $$SELECT idem_claim('hx-odd', NULL, repeat('s', 1000000))$$);
CALL pg_temp.bad(49, $$SELECT idem_claim('hx-odd', NULL, repeat(U&'\+01F600', 64))$$);  -- 64 chars, 256 bytes
CALL pg_temp.bad(50, $$SELECT idem_complete('hx-odd', '{}', 200, repeat(U&'\00E9', 128))$$);
CALL pg_temp.bad(51, $$SELECT idem_fail('hx-odd', scope => repeat('s', 256))$$);
CALL pg_temp.bad(52, $$SELECT idem_lookup('hx-odd', repeat('s', 256))$$);
CALL pg_temp.bad(53, $$SELECT idem_claim('hx-odd', NULL, 'hx' || chr(0))$$);
-- roundtrip(key, scope): claim (twice: the second call is re-entrant), complete, claim again
-- (replay) and look up, in scope `scope`; then compare what was stored and replayed with the input.
CREATE FUNCTION pg_temp.roundtrip(p_key text, p_scope text, p_request jsonb, p_response jsonb,
    OUT outcomes text, OUT scope_intact boolean, OUT fingerprint_ok boolean,
    OUT response_intact boolean, OUT lookup_ok boolean)
LANGUAGE plpgsql AS $$
DECLARE
    c1 idem_claim_result;
    c2 idem_claim_result;
    c3 idem_claim_result;
    done idem_keys;
    stored idem_keys;
BEGIN
    c1 := idem_claim(p_key, p_request, p_scope);
    c2 := idem_claim(p_key, p_request, p_scope);
    done := idem_complete(p_key, p_response, 200, p_scope);
    c3 := idem_claim(p_key, p_request, p_scope);
    outcomes := concat_ws(',', c1.outcome || '/' || c1.inserted, c2.outcome || '/' || c2.inserted,
                          done.state, c3.outcome);
    SELECT * INTO stored FROM idem_keys k WHERE k.scope = p_scope AND k.key = p_key;
    scope_intact := stored.scope = p_scope AND octet_length(stored.scope) = octet_length(p_scope)
                    AND md5(stored.scope) = md5(p_scope) AND done.scope = p_scope;
    fingerprint_ok := stored.fingerprint = sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea
                                                  || convert_to(p_request::text, 'UTF8'));
    response_intact := c3.response = p_response AND md5(c3.response::text) = md5(p_response::text);
    lookup_ok := (idem_lookup(p_key, p_scope)).response = p_response;
END
$$;
CREATE TEMP TABLE hx_scopes (n integer PRIMARY KEY, what text, scope text);
INSERT INTO hx_scopes VALUES
    (54, 'tab',                     E'\t'),
    (55, 'newline',                 E'line1\nline2'),
    (56, 'CR LF',                   E'cr\r\nlf'),
    (57, 'DEL 0x7F',                chr(127)),
    (58, 'C0 controls, ANSI escape', E'\x01\x02\x1b[31mred\x1b[0m'),
    (59, 'every ASCII byte 1..127', (SELECT string_agg(chr(c), '' ORDER BY c) FROM generate_series(1, 127) c)),
    (60, 'e-acute precomposed',     U&'caf\00E9'),
    (61, 'e + combining acute',     U&'cafe\0301'),
    (62, '4-byte emoji',            U&'\+01F600'),
    (63, 'RTL override',            U&'\202Eevil\202C'),
    (64, 'BOM, zero-width space',   U&'\FEFF\200B'),
    (65, 'U+FFFD, U+FFFF',          U&'\FFFD\FFFF'),
    (66, 'no-break space',          U&'\00A0'),
    (67, 'one space',               ' '),
    (68, 'two spaces',              '  '),
    (69, 'SQL injection',           $$'); DROP TABLE idem_keys; --$$),
    (70, 'format and LIKE chars',   '%s%n%x\\_%'),
    (71, '255 bytes of emoji + abc', repeat(U&'\+01F600', 63) || 'abc'),
    (72, 'empty (the default)',     '');
SELECT n, what, octet_length(scope) AS bytes, r.*
FROM hx_scopes CROSS JOIN LATERAL pg_temp.roundtrip('hx-odd', scope, '{"req": [1, "x"]}', '{"resp": "ok"}') r
ORDER BY n;
INSERT INTO hx_cases SELECT n FROM hx_scopes;
-- one row per scope: no two of them were taken for the same scope, every fingerprint differs
SELECT count(*) AS rows, count(DISTINCT scope) AS scopes, count(DISTINCT fingerprint) AS fingerprints
FROM idem_keys WHERE key = 'hx-odd';
-- and each can be found again by its exact scope, and only by it
SELECT count(*) AS found FROM hx_scopes s WHERE (idem_lookup('hx-odd', s.scope)).scope = s.scope;
SELECT idem_lookup('hx-odd', 'cafe') IS NULL AS no_prefix_match,
       idem_lookup('hx-odd', '   ') IS NULL AS no_three_spaces,
       idem_lookup('hx-odd', E'line1\nline2 ') IS NULL AS no_trailing_space;
SELECT 1 AS backend_up;

--
-- 4. ttl and lease: must move the clock forward, by at most 100 years; else 22023, on new and
--    existing keys alike (mixed signs: sec_intervals.sql).  Intervals that PostgreSQL cannot
--    represent fail in PostgreSQL before the function runs.
--
CALL pg_temp.bad(73, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '0')$$);
CALL pg_temp.bad(74, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '-1 s')$$);
CALL pg_temp.bad(75, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '-1 microsecond')$$);
CALL pg_temp.bad(76, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '1 month -30 days')$$);
CALL pg_temp.bad(77, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '1 day -24 hours')$$);
CALL pg_temp.bad(78, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '1 year -361 days')$$);
CALL pg_temp.bad(79, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '101 years')$$);
CALL pg_temp.bad(80, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '1000000 years')$$);
CALL pg_temp.bad(81, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '-1000000 years')$$);
CALL pg_temp.bad(82, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '2147483647 days')$$);
CALL pg_temp.bad(83, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => '0')$$);
CALL pg_temp.bad(84, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => '-5 minutes')$$);
CALL pg_temp.bad(85, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => '1 month -30 days')$$);
CALL pg_temp.bad(86, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => '1000000 years')$$);
CALL pg_temp.bad(87, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => '-2147483648 months')$$);
-- on an existing key (no replay: the arguments are checked first)
CALL pg_temp.bad(88, $$SELECT idem_claim('hx-done', '{"r": 1}', 'hx', lease => '-1 s')$$);
-- beyond interval's range, or not an interval at all: PostgreSQL's own errors
CALL pg_temp.bad(89, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => '178956971 years')$$);
-- 'infinity' is an interval from PostgreSQL 17 on (infinite intervals): there the extension's own
-- bound answers 22023; expected/hostile_1.out is the output on 17 and 18, hostile.out on 15.
CALL pg_temp.bad(90, $$SELECT idem_claim('hx-iv', NULL, 'hx', ttl => 'infinity')$$);
CALL pg_temp.bad(91, $$SELECT idem_claim('hx-iv', NULL, 'hx', lease => 'soon')$$);
SELECT idem_lookup('hx-iv', 'hx') IS NULL AS nothing_claimed;
SELECT 1 AS backend_up;

--
-- 5. Fingerprints: 1..64 bytes, stored and compared as given; else 22023.
--
CALL pg_temp.bad(92, $$SELECT idem_claim('hx-fp', NULL, 'hx', fingerprint => '\x')$$);
CALL pg_temp.bad(93, $$SELECT idem_claim('hx-fp', NULL, 'hx', fingerprint => decode(repeat('ab', 65), 'hex'))$$);
CALL pg_temp.bad(94, $$SELECT idem_claim('hx-fp', NULL, 'hx', fingerprint => decode(repeat('00', 1048576), 'hex'))$$);
CALL pg_temp.bad(95, $$SELECT idem_claim('hx-fp', '{"a": 1}', 'hx', fingerprint => ''::bytea)$$);
-- the bounds: one NUL byte, 64 bytes; a given fingerprint wins over the request's
CALL pg_temp.ok(96);
SELECT outcome, inserted FROM idem_claim('hx-fp', '{"a": 1}', 'hx', fingerprint => '\x00');
SELECT outcome, inserted FROM idem_claim('hx-fp64', NULL, 'hx', fingerprint => decode(repeat('ff', 64), 'hex'));
SELECT key, fingerprint = '\x00' AS nul_byte, octet_length(fingerprint) AS bytes
FROM idem_keys WHERE scope = 'hx' AND key IN ('hx-fp', 'hx-fp64') ORDER BY key;
-- a different fingerprint, or the request's instead of the given one, is a different request
CALL pg_temp.bad(97, $$SELECT idem_claim('hx-fp', '{"a": 1}', 'hx', fingerprint => '\x0000')$$);
CALL pg_temp.bad(98, $$SELECT idem_claim('hx-fp', '{"a": 1}', 'hx')$$);
CALL pg_temp.bad(99, $$SELECT idem_claim('hx-fp64', NULL, 'hx')$$);
SELECT 1 AS backend_up;

--
-- 6. Attempts: not validated; any value other than the row's is stale (IK002).  A missing key is
--    IK003 first; a finished key with its own attempt is IK004.
--
CALL pg_temp.bad(100, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', 0)$$);
CALL pg_temp.bad(101, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', -1)$$);
CALL pg_temp.bad(102, $$SELECT idem_fail('hx-pending', '{}', 500, true, 'hx', -2147483648)$$);
CALL pg_temp.bad(103, $$SELECT idem_fail('hx-pending', '{}', 500, true, 'hx', 2147483647)$$);
CALL pg_temp.bad(104, $$SELECT idem_complete('hx-missing', '{}', 200, 'hx', 1)$$);
CALL pg_temp.bad(105, $$SELECT idem_complete('hx-done', '{}', 200, 'hx', 1)$$);
CALL pg_temp.bad(106, $$SELECT idem_fail('hx-failed', '{}', 500, true, 'hx', 2)$$);
-- stale after a takeover
SELECT outcome, attempt FROM idem_claim('hx-att', NULL, 'hx');
SELECT state FROM idem_fail('hx-att', NULL, 503, true, 'hx', 1);
SELECT outcome, inserted, attempt FROM idem_claim('hx-att', NULL, 'hx');
CALL pg_temp.bad(107, $$SELECT idem_complete('hx-att', '{"late": true}', 200, 'hx', 1)$$);
SELECT state, attempt FROM idem_complete('hx-att', '{"on time": true}', 200, 'hx', 2);
-- a key whose attempt is already INT_MAX (written by hand) cannot be taken over once more: 22003
UPDATE idem_keys SET attempt = 2147483647 WHERE scope = 'hx' AND key = 'hx-att';
SELECT outcome, attempt FROM idem_claim('hx-max', NULL, 'hx');
UPDATE idem_keys SET attempt = 2147483647 WHERE scope = 'hx' AND key = 'hx-max';
SELECT state FROM idem_fail('hx-max', NULL, 503, true, 'hx', 2147483647);
CALL pg_temp.bad(108, $$SELECT idem_claim('hx-max', NULL, 'hx')$$);
SELECT state, attempt FROM idem_lookup('hx-max', 'hx');
SELECT 1 AS backend_up;

--
-- 7. max_rows and batch_size: at least 1, else 22023; the largest integer is fine.
--
CALL pg_temp.bad(109, $$SELECT idem_reap(0)$$);
CALL pg_temp.bad(110, $$SELECT idem_reap(-1)$$);
CALL pg_temp.bad(111, $$SELECT idem_reap(-2147483648)$$);
CALL pg_temp.bad(112, $$CALL idem_reap_all(0)$$);
CALL pg_temp.bad(113, $$CALL idem_reap_all(-5)$$);
CALL pg_temp.ok(114);
SELECT idem_reap(2147483647);
CALL pg_temp.ok(115);
CALL idem_reap_all(2147483647);
-- idem_reap_all commits: not inside a transaction block (here, the helper's subtransaction)
CALL pg_temp.bad(116, $$CALL idem_reap_all()$$);
SELECT 1 AS backend_up;

--
-- 8. Responses and codes: stored and replayed as given, however odd; JSON null is a value.
--
CALL pg_temp.ok(117);
SELECT outcome FROM idem_claim('hx-json-null', NULL, 'hx');
SELECT state, response, response IS NULL AS sql_null FROM idem_complete('hx-json-null', 'null', 200, 'hx');
SELECT outcome, response, response IS NULL AS sql_null FROM idem_claim('hx-json-null', NULL, 'hx');
CALL pg_temp.ok(118);
SELECT outcome FROM idem_claim('hx-codes-1', NULL, 'hx');
SELECT outcome FROM idem_claim('hx-codes-2', NULL, 'hx');
SELECT outcome FROM idem_claim('hx-codes-3', NULL, 'hx');
SELECT response_code FROM idem_complete('hx-codes-1', '"x"', -1, 'hx');
SELECT response_code FROM idem_complete('hx-codes-2', '[]', 0, 'hx');
SELECT response_code FROM idem_fail('hx-codes-3', '1e1000', 2147483647, false, 'hx');
SELECT key, outcome, response_code, length(response::text) AS response_length
FROM (VALUES ('hx-codes-1'), ('hx-codes-2'), ('hx-codes-3')) v(key)
CROSS JOIN LATERAL idem_claim(v.key, NULL, 'hx') ORDER BY key;
-- bodies PostgreSQL cannot represent fail in PostgreSQL before the function runs
CALL pg_temp.bad(119, $$SELECT idem_complete('hx-pending', '"\u0000"', 200, 'hx')$$);
CALL pg_temp.bad(120, $$SELECT idem_complete('hx-pending', '{"a": ', 200, 'hx')$$);
CALL pg_temp.bad(121, $$SELECT idem_claim('hx-pending', '{"a": 1, }', 'hx')$$);
SELECT 1 AS backend_up;

--
-- 9. Deeply nested JSON.  PostgreSQL's jsonb parser recurses and stops at max_stack_depth
--    (54001) before the function runs; a depth that parses is fingerprinted, stored and replayed.
--
CALL pg_temp.bad(122, $$SELECT idem_claim('hx-deep', (repeat('[', 1000000) || repeat(']', 1000000))::jsonb, 'hx')$$);
CALL pg_temp.bad(123, $$SELECT idem_complete('hx-pending', (repeat('{"a":', 1000000) || '1' || repeat('}', 1000000))::jsonb, 200, 'hx')$$);
SELECT n, what, octet_length(scope) AS bytes, r.*
FROM (VALUES (124, 'arrays 5000 deep', 'hx-deep-scope')) v(n, what, scope)
CROSS JOIN LATERAL pg_temp.roundtrip('hx-deep', scope,
    (repeat('[', 5000) || '"request"' || repeat(']', 5000))::jsonb,
    (repeat('{"a": ', 5000) || '"response"' || repeat('}', 5000))::jsonb) r;
CALL pg_temp.ok(124);
-- the same deep request replays; one level less is a different request
SELECT outcome FROM idem_claim('hx-deep', (repeat('[', 5000) || '"request"' || repeat(']', 5000))::jsonb, 'hx-deep-scope');
CALL pg_temp.bad(125, $$SELECT idem_claim('hx-deep', (repeat('[', 4999) || '"request"' || repeat(']', 4999))::jsonb, 'hx-deep-scope')$$);
SELECT 1 AS backend_up;

--
-- 10. A 100 MB response (compressible: TOAST keeps it at about 1 MB on disk) is stored and
--     replayed intact (md5 of its text), then deleted; a 100 MB request is fingerprinted (only
--     the 32-byte hash is stored).  jsonb itself cannot hold a string of 256 MB or more.
--
SELECT outcome, inserted FROM idem_claim('hx-100mb', jsonb_build_object('x', repeat('r', 100 * 1024 * 1024)), 'hx');
SELECT fingerprint = sha256(convert_to('hx', 'UTF8') || '\x00'::bytea
                            || convert_to(jsonb_build_object('x', repeat('r', 100 * 1024 * 1024))::text, 'UTF8'))
       AS request_fingerprint_ok
FROM idem_keys WHERE scope = 'hx' AND key = 'hx-100mb';
CALL pg_temp.ok(126);
SELECT state, md5(response::text), octet_length(response::text)
FROM idem_complete('hx-100mb', jsonb_build_object('x', repeat('a', 100 * 1024 * 1024)), 201, 'hx');
CALL pg_temp.ok(127);
SELECT outcome, response_code, md5(response::text), octet_length(response::text)
FROM idem_claim('hx-100mb', jsonb_build_object('x', repeat('r', 100 * 1024 * 1024)), 'hx');
SELECT md5((idem_lookup('hx-100mb', 'hx')).response::text);
SELECT pg_column_size(response) < 10 * 1024 * 1024 AS compressed FROM idem_keys WHERE key = 'hx-100mb';
DELETE FROM idem_keys WHERE scope = 'hx' AND key = 'hx-100mb';
SELECT idem_lookup('hx-100mb', 'hx') IS NULL AS deleted;
CALL pg_temp.bad(128, $$SELECT idem_complete('hx-pending', jsonb_build_array(repeat('a', 268435456)), 200, 'hx')$$);
SELECT 1 AS backend_up;

--
-- 11. Scheduling: the schedule is quoted as a literal in the HINT, whatever it contains.
--
CALL pg_temp.bad(129, $k$SELECT idem_schedule_reaper($$* * * * *'); DROP TABLE idem_keys; --$$)$k$);
CALL pg_temp.bad(130, $$SELECT idem_unschedule_reaper()$$);
SELECT 1 AS backend_up;

--
-- 12. Version 1.2's arguments: NULLs, negative, zero and huge intervals, wrong attempts, bad
--     headers; every refusal leaves idem_keys unchanged.  Huge bodies and headers are stored and
--     replayed intact (no limit but PostgreSQL's 1 GB per value).
--
-- wait on idem_claim: 0 .. 1 hour
CALL pg_temp.bad(131, $$SELECT idem_claim('hx-pending', '{"r": 1}', 'hx', wait => '-1 microsecond')$$);
CALL pg_temp.bad(132, $$SELECT idem_claim('hx-new12', NULL, 'hx', wait => '1 hour 1 second')$$);
CALL pg_temp.bad(133, $$SELECT idem_claim('hx-new12', NULL, 'hx', wait => '178000000 years')$$);
CALL pg_temp.bad(134, $$SELECT idem_claim('hx-new12', NULL, 'hx', wait => '-178000000 years')$$);
CALL pg_temp.bad(135, $$SELECT idem_claim('hx-new12', NULL, 'hx', wait => '1 mon -29 days')$$);
-- ttl on idem_complete / idem_fail
CALL pg_temp.bad(136, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', ttl => '0')$$);
CALL pg_temp.bad(137, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', ttl => '-1 day')$$);
CALL pg_temp.bad(138, $$SELECT idem_fail('hx-pending', '{}', 500, true, 'hx', ttl => '101 years')$$);
CALL pg_temp.bad(139, $$SELECT idem_fail('hx-pending', '{}', 500, true, 'hx', ttl => '-1 year 361 days')$$);
-- headers: a JSON object only
CALL pg_temp.bad(140, $$SELECT idem_complete('hx-pending', '{}', 200, 'hx', headers => '"Location: /x"')$$);
CALL pg_temp.bad(141, $$SELECT idem_fail('hx-pending', '{}', 500, true, 'hx', headers => '[["Location", "/x"]]')$$);
-- a body or headers on a finished or missing key: IK004 / IK003, and no value in the message
CALL pg_temp.bad(142, $$SELECT idem_complete('hx-done', NULL, 200, 'hx', body => 'secret-body-bytes', headers => '{"Set-Cookie": "secret"}')$$);
CALL pg_temp.bad(143, $$SELECT idem_fail('hx-missing', NULL, 500, true, 'hx', body => 'secret-body-bytes')$$);
-- idem_extend / idem_release: NULLs, bad leases, wrong attempts
CALL pg_temp.bad(144, $$SELECT idem_extend(NULL, 1, '1 minute', 'hx')$$);
CALL pg_temp.bad(145, $$SELECT idem_extend('hx-pending', NULL, '1 minute', 'hx')$$);
CALL pg_temp.bad(146, $$SELECT idem_extend('hx-pending', 1, NULL, 'hx')$$);
CALL pg_temp.bad(147, $$SELECT idem_extend('hx-pending', 1, '1 minute', NULL)$$);
CALL pg_temp.bad(148, $$SELECT idem_extend('hx-pending', 1, '0', 'hx')$$);
CALL pg_temp.bad(149, $$SELECT idem_extend('hx-pending', 1, '-1 s', 'hx')$$);
CALL pg_temp.bad(150, $$SELECT idem_extend('hx-pending', 1, '178000000 years', 'hx')$$);
CALL pg_temp.bad(151, $$SELECT idem_extend('hx-pending', 0, '1 minute', 'hx')$$);
CALL pg_temp.bad(152, $$SELECT idem_extend('hx-pending', -2147483648, '1 minute', 'hx')$$);
CALL pg_temp.bad(153, $$SELECT idem_extend('hx-pending', 2147483647, '1 minute', 'hx')$$);
CALL pg_temp.bad(154, $$SELECT idem_extend('hx-done', 1, '1 minute', 'hx')$$);
CALL pg_temp.bad(155, $$SELECT idem_extend('hx-missing', 1, '1 minute', 'hx')$$);
CALL pg_temp.bad(156, $$SELECT idem_extend(E'hx\x01', 1, '1 minute', 'hx')$$);
CALL pg_temp.bad(157, $$SELECT idem_release(NULL, 1, 'hx')$$);
CALL pg_temp.bad(158, $$SELECT idem_release('hx-pending', NULL, 'hx')$$);
CALL pg_temp.bad(159, $$SELECT idem_release('hx-pending', 1, NULL)$$);
CALL pg_temp.bad(160, $$SELECT idem_release('hx-pending', 2, 'hx')$$);
CALL pg_temp.bad(161, $$SELECT idem_release('hx-failed', 1, 'hx')$$);
CALL pg_temp.bad(162, $$SELECT idem_release(repeat('k', 256), 1, 'hx')$$);
-- idem_forget: NULLs, a live lease without force
SELECT outcome FROM idem_claim('hx-live', NULL, 'hx', lease => '1 hour');
CALL pg_temp.bad(163, $$SELECT idem_forget(NULL, 'hx')$$);
CALL pg_temp.bad(164, $$SELECT idem_forget('hx-pending', NULL)$$);
CALL pg_temp.bad(165, $$SELECT idem_forget('hx-pending', 'hx', NULL)$$);
CALL pg_temp.bad(166, $$SELECT idem_forget('hx-live', 'hx')$$);
CALL pg_temp.bad(167, $$SELECT idem_forget('hx-pending', repeat('s', 256))$$);
-- a huge body (64 MB of incompressible bytes) and huge headers (10 000 of them): stored and
-- replayed intact
SELECT outcome FROM idem_claim('hx-bigbody', NULL, 'hx');
CALL pg_temp.ok(168);
SELECT state, length(response_body), md5(response_body), (SELECT count(*) FROM jsonb_object_keys(response_headers)) AS headers
FROM idem_complete('hx-bigbody', NULL, 200, 'hx',
                   body => (SELECT string_agg(sha256(int4send(g)), ''::bytea) FROM generate_series(1, 2097152) g),
                   headers => (SELECT jsonb_object_agg('X-H-' || g, repeat('v', 100)) FROM generate_series(1, 10000) g));
CALL pg_temp.ok(169);
SELECT outcome, length(response_body), md5(response_body), (SELECT count(*) FROM jsonb_object_keys(response_headers)) AS headers
FROM idem_claim('hx-bigbody', NULL, 'hx');
DELETE FROM idem_keys WHERE scope = 'hx' AND key = 'hx-bigbody';
SELECT 1 AS backend_up;

-- Every case ran; the backend is the one that started; the keys of section 1 are as they were.
SELECT count(*) AS cases, min(n), max(n), count(*) = max(n) AS numbered_without_gaps FROM hx_cases;
SELECT pg_backend_pid() = :hostile_pid AS same_backend;
SELECT key, state, attempt, response, response_code, retryable
FROM idem_keys WHERE scope = 'hx' AND key IN ('hx-pending', 'hx-done', 'hx-failed') ORDER BY key;

\c :regress_database
DROP DATABASE regress_idem_hostile;
