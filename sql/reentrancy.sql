--
-- Re-entrant calls (docs/contract.md §2 step 4): a claim of a key whose current row version this
-- transaction wrote sees that row: pending -> claimed, finished -> replay, inserted false,
-- even within one statement; the fingerprint check still comes first.  Rollback (of the
-- transaction or of a savepoint) undoes a claim completely.
-- Keys of this file live in scope 're'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. Two claims in one transaction: claimed + inserted, then claimed (not in_progress), not
-- inserted, same attempt, no retry_after.
BEGIN;
SELECT outcome, inserted, attempt, state, response, retry_after FROM idem_claim('re-1', '{"n": 1}', 're');
SELECT outcome, inserted, attempt, state, response, retry_after FROM idem_claim('re-1', '{"n": 1}', 're');
SELECT outcome, inserted, attempt, state, response, retry_after FROM idem_claim('re-1', '{"n": 1}', 're');
COMMIT;
-- after commit, another transaction sees a live lease: in_progress
SELECT outcome, inserted, attempt, retry_after > interval '0' AS retry_after_positive
FROM idem_claim('re-1', '{"n": 1}', 're');

-- 2. Two claims in one statement.
SELECT (a).outcome AS a_outcome, (a).inserted AS a_inserted, (a).attempt AS a_attempt,
       (b).outcome AS b_outcome, (b).inserted AS b_inserted, (b).attempt AS b_attempt
FROM (SELECT idem_claim('re-2', NULL, 're') AS a, idem_claim('re-2', NULL, 're') AS b OFFSET 0) s;
-- three claims of one key in one statement, one per row (the request refers to g so that the
-- function is called again for each row instead of being read back from the first call)
SELECT g, c.outcome, c.inserted, c.attempt, c.state
FROM generate_series(1, 3) g, LATERAL idem_claim('re-3', jsonb_build_object('n', 3 + 0 * g), 're') c
ORDER BY g;
-- the fingerprint check applies within the statement too
CALL pg_temp.expect_error($$
SELECT v.n, c.outcome
FROM (VALUES (1, '{"n": 1}'::jsonb), (2, '{"n": 2}'::jsonb)) v(n, r),
     LATERAL idem_claim('re-4', v.r, 're') c
$$);
SELECT count(*) AS keys FROM idem_keys WHERE scope = 're' AND key = 're-4';
SELECT count(*) AS keys, min(attempt) AS attempt FROM idem_keys WHERE scope = 're' AND key IN ('re-2', 're-3');

-- 3. Claim, complete, claim in one transaction: replay of this transaction's response.
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-5', '{"n": 5}', 're');
SELECT state, response, response_code FROM idem_complete('re-5', '{"ok": 5}', 201, 're');
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('re-5', '{"n": 5}', 're');
COMMIT;
SELECT outcome, inserted, attempt, state, response, response_code FROM idem_claim('re-5', '{"n": 5}', 're');
-- claim, fail (retryable), claim in one transaction: the transaction's own failure is
-- returned as it is (replay), it is not taken over by the same transaction
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-6', NULL, 're');
SELECT state, retryable FROM idem_fail('re-6', '{"e": 1}', 503, true, 're');
SELECT outcome, inserted, attempt, state, response, response_code FROM idem_claim('re-6', NULL, 're');
COMMIT;
-- in a later transaction the retryable failure is taken over
SELECT outcome, inserted, attempt, state, response, response_code FROM idem_claim('re-6', NULL, 're');

-- 4. The fingerprint check comes before the re-entrant answer.
BEGIN;
SELECT outcome, inserted FROM idem_claim('re-7', '{"v": 1}', 're');
CALL pg_temp.expect_error($$SELECT idem_claim('re-7', '{"v": 2}', 're')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('re-7', NULL, 're')$$);
SELECT outcome, inserted, attempt FROM idem_claim('re-7', '{"v": 1}', 're');
SELECT state FROM idem_complete('re-7', '{}', scope => 're');
CALL pg_temp.expect_error($$SELECT idem_claim('re-7', '{"v": 2}', 're')$$);
SELECT outcome, inserted, attempt FROM idem_claim('re-7', '{"v": 1}', 're');
COMMIT;

-- 5. A takeover is written by this transaction too: a second claim is re-entrant (claimed,
-- same attempt), even after the new lease has run out.
SELECT outcome, inserted, attempt FROM idem_claim('re-8', NULL, 're', lease => '10 ms');
SELECT pg_sleep(0.05);
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-8', NULL, 're', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt, state FROM idem_claim('re-8', NULL, 're', lease => '10 ms');
SELECT state, attempt FROM idem_complete('re-8', '{}', scope => 're', attempt => 2);
COMMIT;
SELECT outcome, inserted, attempt, state FROM idem_claim('re-8', NULL, 're');

-- 6. ROLLBACK of a claim leaves no row: lookup NULL, a new claim inserts again.
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-9', NULL, 're');
-- this transaction's own row is visible to its later statements
SELECT state, attempt FROM idem_lookup('re-9', 're');
ROLLBACK;
SELECT idem_lookup('re-9', 're') IS NULL AS no_row;
SELECT count(*) AS keys FROM idem_keys WHERE scope = 're' AND key = 're-9';
SELECT outcome, inserted, attempt FROM idem_claim('re-9', NULL, 're');
-- rolling back a claim and its complete leaves nothing either
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-10', NULL, 're');
SELECT state FROM idem_complete('re-10', '{}', scope => 're');
ROLLBACK;
SELECT idem_lookup('re-10', 're') IS NULL AS no_row;
-- a rolled back takeover leaves the old attempt
SELECT outcome, inserted, attempt FROM idem_claim('re-11', NULL, 're', lease => '10 ms');
SELECT pg_sleep(0.05);
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-11', NULL, 're');
ROLLBACK;
SELECT state, attempt FROM idem_lookup('re-11', 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-11', NULL, 're');

-- 7. Savepoints.
-- the claim in a rolled back savepoint is gone; claim again inserts
BEGIN;
SAVEPOINT s1;
SELECT outcome, inserted, attempt FROM idem_claim('re-12', NULL, 're');
ROLLBACK TO SAVEPOINT s1;
SELECT idem_lookup('re-12', 're') IS NULL AS no_row;
SELECT outcome, inserted, attempt FROM idem_claim('re-12', NULL, 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-12', NULL, 're');
COMMIT;
SELECT state, attempt FROM idem_lookup('re-12', 're');
-- a complete in a rolled back savepoint is undone: the key is this transaction's pending claim
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('re-13', NULL, 're');
SAVEPOINT s1;
SELECT state FROM idem_complete('re-13', '{"first": true}', scope => 're');
SELECT outcome, inserted, state, response FROM idem_claim('re-13', NULL, 're');
ROLLBACK TO SAVEPOINT s1;
SELECT outcome, inserted, attempt, state, response FROM idem_claim('re-13', NULL, 're');
SELECT state, response FROM idem_complete('re-13', '{"second": true}', scope => 're');
COMMIT;
SELECT outcome, inserted, attempt, state, response FROM idem_claim('re-13', NULL, 're');
-- a claim inside a savepoint that is released, and one in a subtransaction that errors
BEGIN;
SAVEPOINT s1;
SELECT outcome, inserted FROM idem_claim('re-14', NULL, 're');
RELEASE SAVEPOINT s1;
SELECT outcome, inserted FROM idem_claim('re-14', NULL, 're');
CALL pg_temp.expect_error($$SELECT (idem_claim('re-15', NULL, 're')).inserted, 1 / (0 * random())::int$$);
SELECT idem_lookup('re-15', 're') IS NULL AS no_row;
SELECT outcome, inserted FROM idem_claim('re-15', NULL, 're');
COMMIT;
SELECT key, state, attempt FROM idem_keys WHERE scope = 're' AND key IN ('re-14', 're-15') ORDER BY key;

-- 8. The same under REPEATABLE READ and SERIALIZABLE (keys committed before the snapshot, and
-- this transaction's own rows, are visible: no serialization failure).
SELECT outcome FROM idem_claim('re-16', NULL, 're');
SELECT state FROM idem_complete('re-16', '{"r": 16}', scope => 're');
SELECT outcome FROM idem_claim('re-17', NULL, 're');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome, inserted, attempt, response FROM idem_claim('re-16', NULL, 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-17', NULL, 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-18', NULL, 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-18', NULL, 're');
SELECT state FROM idem_complete('re-18', '{}', scope => 're');
SELECT outcome, inserted, attempt, state FROM idem_claim('re-18', NULL, 're');
SELECT state FROM idem_lookup('re-18', 're');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT outcome, inserted, attempt, response FROM idem_claim('re-16', NULL, 're');
SELECT outcome, inserted, attempt FROM idem_claim('re-19', NULL, 're');
SELECT state FROM idem_fail('re-19', scope => 're');
SELECT outcome, inserted, attempt, state FROM idem_claim('re-19', NULL, 're');
SELECT state FROM idem_complete('re-17', '{}', scope => 're');
COMMIT;
SELECT key, state, attempt FROM idem_keys WHERE scope = 're' AND key IN ('re-16', 're-17', 're-18', 're-19')
ORDER BY key;

DELETE FROM idem_keys WHERE scope = 're';
