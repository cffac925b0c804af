--
-- Version 1.2, responses that come back byte for byte (docs/contract.md §9.7): body bytea and headers jsonb
-- on idem_complete / idem_fail, the columns response_body / response_headers on idem_keys and on
-- idem_claim_result, a response with no body at all (204).
-- Keys of this file live in scope 'rs'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. A byte-exact body and headers, replayed exactly as stored.
SELECT outcome FROM idem_claim('rs-xml', '{"order": 7}', 'rs');
SELECT state, response, response_code, response_body, response_headers
FROM idem_complete('rs-xml', NULL, 201, 'rs',
                   body => convert_to('<order id="7"/>' || chr(10), 'UTF8'),
                   headers => '{"Location": "/orders/7", "Content-Type": "application/xml"}');
SELECT outcome, state, response, response_code, convert_from(response_body, 'UTF8') AS body,
       response_headers
FROM idem_claim('rs-xml', '{"order": 7}', 'rs');
-- a signed JSON body keeps its exact bytes (key order, spaces, number forms), unlike jsonb
SELECT outcome FROM idem_claim('rs-signed', NULL, 'rs');
SELECT response_body = convert_to('{"z":1,  "a":1.50}', 'UTF8') AS stored_exactly
FROM idem_complete('rs-signed', '{"z":1,  "a":1.50}', 200, 'rs', body => convert_to('{"z":1,  "a":1.50}', 'UTF8'));
SELECT response::text AS normalised_jsonb, convert_from(response_body, 'UTF8') AS exact_body
FROM idem_claim('rs-signed', NULL, 'rs');
-- any bytes: NUL, invalid UTF-8, all 256 values
SELECT outcome FROM idem_claim('rs-binary', NULL, 'rs');
SELECT length(response_body) FROM idem_fail('rs-binary', NULL, 502, false, 'rs',
    body => (SELECT string_agg(set_byte('\x00'::bytea, 0, b), ''::bytea ORDER BY b) FROM generate_series(0, 255) b));
SELECT outcome, state, response_code, length(response_body),
       response_body = (SELECT string_agg(set_byte('\x00'::bytea, 0, b), ''::bytea ORDER BY b)
                        FROM generate_series(0, 255) b) AS same_bytes
FROM idem_claim('rs-binary', NULL, 'rs');
-- an empty body is a body (not NULL)
SELECT outcome FROM idem_claim('rs-empty', NULL, 'rs');
SELECT response_body IS NOT NULL AS has_body, length(response_body)
FROM idem_complete('rs-empty', NULL, 200, 'rs', body => '');

-- 2. No body at all: a 204 No Content.
SELECT outcome FROM idem_claim('rs-204', NULL, 'rs');
SELECT state, response, response_code, response_body, response_headers
FROM idem_complete('rs-204', NULL, 204, 'rs');
SELECT outcome, state, response, response_code, response_body, response_headers
FROM idem_claim('rs-204', NULL, 'rs');

-- 3. headers must be a JSON object; body and headers are optional; errors change nothing.
SELECT outcome FROM idem_claim('rs-bad', NULL, 'rs');
CALL pg_temp.expect_error($$SELECT idem_complete('rs-bad', '{}', 200, 'rs', headers => '[]')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('rs-bad', '{}', 200, 'rs', headers => '"text/plain"')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('rs-bad', '{}', 500, true, 'rs', headers => 'null')$$);
SELECT state, response_body, response_headers FROM idem_keys WHERE scope = 'rs' AND key = 'rs-bad';
SELECT response_headers FROM idem_complete('rs-bad', NULL, 200, 'rs', headers => '{}');

-- 4. A takeover clears the previous attempt's body and headers with its response.
SELECT outcome FROM idem_claim('rs-retry', NULL, 'rs');
SELECT state FROM idem_fail('rs-retry', '{"e": 1}', 503, true, 'rs', body => '\x01', headers => '{"Retry-After": "1"}');
SELECT outcome, attempt, response, response_body, response_headers FROM idem_claim('rs-retry', NULL, 'rs');
SELECT response, response_body, response_headers FROM idem_keys WHERE scope = 'rs' AND key = 'rs-retry';

-- 5. Positional readers of 1.1's attributes keep working: the new ones come last.
SELECT string_agg(key, ', ') AS columns_in_order
FROM json_each(row_to_json(idem_claim('rs-204', NULL, 'rs')));
SELECT row_to_json(idem_claim('rs-204', NULL, 'rs'))::jsonb - 'expires_at' AS result;

-- 6. No error or log line shows a body or a header value.
CALL pg_temp.expect_error($$SELECT idem_complete('rs-xml', NULL, 200, 'rs', body => 'secret-body', headers => '{"Set-Cookie": "secret-cookie"}')$$);
