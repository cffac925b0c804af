--
-- idem_complete and idem_fail (docs/contract.md §2): the finished row they return, the state transitions,
-- IK003 (no such key), IK002 (stale attempt: fencing), IK004 (not pending) and their order.
-- Keys of this file live in scope 'cf'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. complete: pending -> succeeded; response and code stored, completed_at = clock, lease
-- ended (locked_until NULL), retryable NULL; returns the whole row, as stored.
SELECT outcome, inserted, attempt FROM idem_claim('ok-1', '{"n": 1}', 'cf');
CREATE TEMP TABLE returned AS
SELECT * FROM idem_complete('ok-1', '{"id": 1, "status": "done"}', 201, 'cf');
SELECT scope, key, state, attempt, fingerprint IS NOT NULL AS has_fingerprint, response,
       response_code, retryable, locked_until, completed_at >= created_at AS completed_after_created,
       completed_at <= clock_timestamp() AS completed_in_past
FROM returned;
-- the returned row is the stored row, column for column (EXCEPT treats NULLs as equal)
SELECT count(*) AS differences FROM (
    (SELECT * FROM returned EXCEPT SELECT * FROM idem_keys WHERE scope = 'cf' AND key = 'ok-1')
    UNION ALL
    (SELECT * FROM idem_keys WHERE scope = 'cf' AND key = 'ok-1' EXCEPT SELECT * FROM returned)
) d;
DROP TABLE returned;
-- response_code defaults to 200
SELECT outcome FROM idem_claim('ok-2', NULL, 'cf');
SELECT state, response, response_code FROM idem_complete('ok-2', '[1, 2, 3]', scope => 'cf');

-- 2. fail: pending -> failed; retryable as given; same row shape.
SELECT outcome FROM idem_claim('fail-1', NULL, 'cf');
CREATE TEMP TABLE returned AS
SELECT * FROM idem_fail('fail-1', '{"error": "card declined"}', 402, false, 'cf');
SELECT scope, key, state, attempt, response, response_code, retryable, locked_until,
       completed_at >= created_at AS completed_after_created
FROM returned;
SELECT count(*) AS differences FROM (
    (SELECT * FROM returned EXCEPT SELECT * FROM idem_keys WHERE scope = 'cf' AND key = 'fail-1')
    UNION ALL
    (SELECT * FROM idem_keys WHERE scope = 'cf' AND key = 'fail-1' EXCEPT SELECT * FROM returned)
) d;
DROP TABLE returned;
-- fail's defaults: response NULL, response_code 500, retryable true
SELECT outcome FROM idem_claim('fail-2', NULL, 'cf');
SELECT state, attempt, response, response_code, retryable, locked_until,
       completed_at IS NOT NULL AS completed
FROM idem_fail('fail-2', scope => 'cf');
-- explicit retryable true with a response
SELECT outcome FROM idem_claim('fail-3', NULL, 'cf');
SELECT state, response, response_code, retryable
FROM idem_fail('fail-3', '{"error": "busy"}', 503, true, 'cf');

-- completed_at is the wall clock of the call, not the transaction start
BEGIN;
SELECT outcome FROM idem_claim('clock-1', NULL, 'cf');
SELECT pg_sleep(0.1);
SELECT state, completed_at >= now() + interval '0.1 s' AS completed_at_is_clock
FROM idem_complete('clock-1', '{}', scope => 'cf');
COMMIT;

-- a pending key whose lease has run out (not taken over yet) can still be finished
SELECT outcome FROM idem_claim('late-1', NULL, 'cf', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state, attempt, response_code FROM idem_complete('late-1', '{}', 200, 'cf');
SELECT outcome FROM idem_claim('late-2', NULL, 'cf', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state, attempt, response_code, retryable FROM idem_fail('late-2', NULL, 500, false, 'cf', 1);

-- 3. IK003: no such key (in this scope), for complete and fail, with or without attempt.
CALL pg_temp.expect_error($$SELECT idem_complete('missing', '{}', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('missing', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('missing', '{}', scope => 'cf', attempt => 1)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('missing', scope => 'cf', attempt => 3)$$);
-- ok-1 exists in scope 'cf', not in scope '' nor 'cf-other'
CALL pg_temp.expect_error($$SELECT idem_complete('ok-1', '{}')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('ok-1', scope => 'cf-other')$$);
SELECT count(*) AS keys FROM idem_keys WHERE key = 'missing' OR scope = 'cf-other';

-- 4. IK004: the key is not pending (already succeeded or failed), whatever the new call.
CALL pg_temp.expect_error($$SELECT idem_complete('ok-1', '{"again": true}', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('ok-1', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('fail-1', '{}', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fail-1', scope => 'cf')$$);
-- a retryable failure is not pending either (only a claim can take it over)
CALL pg_temp.expect_error($$SELECT idem_complete('fail-2', '{}', scope => 'cf')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fail-2', scope => 'cf', attempt => 1)$$);
-- nothing changed
SELECT key, state, attempt, response, response_code, retryable
FROM idem_keys WHERE scope = 'cf' AND key IN ('ok-1', 'fail-1', 'fail-2') ORDER BY key;

-- 5. Fencing with attempt: matching attempt works, a stale (or any other) attempt is IK002.
SELECT outcome, attempt FROM idem_claim('fence-1', NULL, 'cf');
SELECT state, attempt FROM idem_complete('fence-1', '{"by": 1}', scope => 'cf', attempt => 1);
SELECT outcome, attempt FROM idem_claim('fence-2', NULL, 'cf', lease => '10 ms');
SELECT pg_sleep(0.05);
-- taken over: attempt 2 owns the key now
SELECT outcome, inserted, attempt FROM idem_claim('fence-2', NULL, 'cf');
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{"by": 1}', scope => 'cf', attempt => 1)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fence-2', '{"by": 1}', 500, true, 'cf', 1)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{"by": 3}', scope => 'cf', attempt => 3)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{"by": 0}', scope => 'cf', attempt => 0)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{"by": -1}', scope => 'cf', attempt => -1)$$);
SELECT state, attempt, response FROM idem_keys WHERE scope = 'cf' AND key = 'fence-2';
-- the current owner finishes it
SELECT state, attempt, response FROM idem_complete('fence-2', '{"by": 2}', scope => 'cf', attempt => 2);
SELECT outcome, inserted, attempt, state, response FROM idem_claim('fence-2', NULL, 'cf');
-- fail with a matching attempt
SELECT outcome, attempt FROM idem_claim('fence-3', NULL, 'cf', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, attempt FROM idem_claim('fence-3', NULL, 'cf');
SELECT state, attempt, retryable FROM idem_fail('fence-3', NULL, 500, true, 'cf', 2);
-- an attempt that was never handed out is not the row's attempt either
SELECT outcome, attempt FROM idem_claim('fence-4', NULL, 'cf');
CALL pg_temp.expect_error($$SELECT idem_complete('fence-4', '{}', scope => 'cf', attempt => 2)$$);
SELECT state, attempt FROM idem_complete('fence-4', '{}', scope => 'cf', attempt => 1);
-- without attempt there is no fencing: the call finishes whatever attempt is current
SELECT outcome, attempt FROM idem_claim('fence-3', NULL, 'cf');
SELECT state, attempt FROM idem_complete('fence-3', '{}', scope => 'cf');

-- 6. Error order: IK003, then IK002 (attempt given and different), then IK004.
-- missing key with an attempt: IK003
CALL pg_temp.expect_error($$SELECT idem_complete('fence-9', '{}', scope => 'cf', attempt => 7)$$);
-- fence-2 is succeeded at attempt 2: a stale attempt is IK002 (not IK004) ...
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{}', scope => 'cf', attempt => 1)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fence-2', scope => 'cf', attempt => 1)$$);
-- ... the current attempt or none is IK004
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{}', scope => 'cf', attempt => 2)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fence-2', scope => 'cf', attempt => 2)$$);
CALL pg_temp.expect_error($$SELECT idem_complete('fence-2', '{}', scope => 'cf')$$);
-- fence-3 is succeeded at attempt 3 after a failure at attempt 2
CALL pg_temp.expect_error($$SELECT idem_fail('fence-3', scope => 'cf', attempt => 2)$$);
CALL pg_temp.expect_error($$SELECT idem_fail('fence-3', scope => 'cf', attempt => 3)$$);
SELECT key, state, attempt, response FROM idem_keys
WHERE scope = 'cf' AND key LIKE 'fence-%' ORDER BY key;

-- 7. State transitions seen through idem_lookup: pending -> failed (retryable) -> pending
-- (takeover) -> succeeded.
SELECT outcome, attempt FROM idem_claim('flow-1', NULL, 'cf');
SELECT state, attempt, locked_until IS NOT NULL AS leased, completed_at IS NOT NULL AS completed
FROM idem_lookup('flow-1', 'cf');
SELECT state FROM idem_fail('flow-1', '{"error": 1}', 503, true, 'cf', 1);
SELECT state, attempt, response, retryable, locked_until IS NOT NULL AS leased,
       completed_at IS NOT NULL AS completed
FROM idem_lookup('flow-1', 'cf');
SELECT outcome, attempt FROM idem_claim('flow-1', NULL, 'cf');
SELECT state, attempt, response, retryable, locked_until IS NOT NULL AS leased,
       completed_at IS NOT NULL AS completed
FROM idem_lookup('flow-1', 'cf');
SELECT state FROM idem_complete('flow-1', '{"ok": 1}', 200, 'cf', 2);
SELECT state, attempt, response, response_code, retryable, locked_until IS NOT NULL AS leased,
       completed_at IS NOT NULL AS completed
FROM idem_lookup('flow-1', 'cf');

-- 8. A complete that is rolled back leaves the key pending; it can be finished afterwards.
SELECT outcome FROM idem_claim('tx-1', NULL, 'cf');
BEGIN;
SELECT state FROM idem_complete('tx-1', '{"first": true}', scope => 'cf');
ROLLBACK;
SELECT state, response FROM idem_lookup('tx-1', 'cf');
SELECT state, response FROM idem_complete('tx-1', '{"second": true}', scope => 'cf');

DELETE FROM idem_keys WHERE scope = 'cf';
