--
-- After a claim that created its key, the next claim of the backend inserts first and lets the
-- primary key's unique check decide (docs/design.md, "Claim: look first or insert first").
-- Every outcome of an existing key must come out exactly as when the claim looks first: the
-- speculative tuple is killed, nothing of it is visible, no key is doubled, the counters count
-- the outcome once. Whether a claim wrote shows as txid_current_if_assigned() in its transaction.
-- Keys of this file live in scope 'first'.
--
\pset null '(null)'
SET client_min_messages = warning;

-- keys in every state, committed by earlier transactions
SELECT outcome, inserted FROM idem_claim('done', '{"r": 1}', 'first');
SELECT state FROM idem_complete('done', '{"ok": true}', 201, 'first');
SELECT outcome FROM idem_claim('failed-final', '{"r": 2}', 'first');
SELECT state FROM idem_fail('failed-final', '{"e": 1}', 400, false, 'first');
SELECT outcome FROM idem_claim('failed-retry', '{"r": 3}', 'first');
SELECT state FROM idem_fail('failed-retry', '{"e": 2}', 503, true, 'first');
SELECT outcome FROM idem_claim('busy', '{"r": 4}', 'first', lease => '1 hour');
SELECT outcome FROM idem_claim('abandoned', '{"r": 5}', 'first', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT idem_stats_reset();

-- Each block: a claim of a new key (so that the next claim inserts first), then a claim of an
-- existing key in its own transaction.
-- 1. replay of a succeeded key
SELECT outcome, inserted FROM idem_claim('new-1', '{}', 'first');
BEGIN;
SELECT outcome, inserted, attempt, state, response, response_code FROM idem_claim('done', '{"r": 1}', 'first');
SELECT txid_current_if_assigned() IS NOT NULL AS wrote;
COMMIT;
-- a second replay in a row looks first: read-only
BEGIN;
SELECT outcome, inserted, state FROM idem_claim('done', '{"r": 1}', 'first');
SELECT txid_current_if_assigned() IS NOT NULL AS wrote;
COMMIT;

-- 2. replay of a failed key that may not be retried
SELECT outcome, inserted FROM idem_claim('new-2', '{}', 'first');
SELECT outcome, inserted, attempt, state, response, response_code FROM idem_claim('failed-final', '{"r": 2}', 'first');

-- 3. in_progress: someone else's live lease
SELECT outcome, inserted FROM idem_claim('new-3', '{}', 'first');
SELECT outcome, inserted, attempt, state, retry_after > interval '59 minutes' AS retry_after_lease
FROM idem_claim('busy', '{"r": 4}', 'first');

-- 4. takeover of a retryable failure and of an abandoned lease
SELECT outcome, inserted FROM idem_claim('new-4', '{}', 'first');
SELECT outcome, inserted, attempt, state, response FROM idem_claim('failed-retry', '{"r": 3}', 'first');
SELECT outcome, inserted FROM idem_claim('new-5', '{}', 'first');
SELECT outcome, inserted, attempt, state FROM idem_claim('abandoned', '{"r": 5}', 'first');

-- 5. a different request: IK001, and the guess's tuple goes with the aborted transaction
SELECT outcome, inserted FROM idem_claim('new-6', '{}', 'first');
SELECT xmin AS done_xmin FROM idem_keys WHERE scope = 'first' AND key = 'done' \gset
DO $$
BEGIN
    PERFORM idem_claim('done', '{"r": "other"}', 'first');
EXCEPTION WHEN SQLSTATE 'IK001' THEN
    RAISE NOTICE 'IK001';
END
$$;
SELECT xmin::text = :'done_xmin' AS row_unchanged, state FROM idem_keys WHERE scope = 'first' AND key = 'done';

-- 6. a re-entrant claim in the claiming transaction: still its claim, not a new row
BEGIN;
SELECT outcome, inserted, attempt FROM idem_claim('new-7', '{"x": 1}', 'first');
SELECT outcome, inserted, attempt FROM idem_claim('new-7', '{"x": 1}', 'first');
SELECT state FROM idem_complete('new-7', '{"done": 7}', scope => 'first');
SELECT outcome, inserted, state, response FROM idem_claim('new-7', '{"x": 1}', 'first');
COMMIT;

-- 7. several existing keys in one statement after a new one: each decided on its own row
SELECT k, c.outcome, c.inserted, c.attempt
FROM unnest(ARRAY['new-8', 'done', 'busy', 'new-8', 'failed-final']) WITH ORDINALITY AS u(k, i),
     idem_claim(k, CASE k WHEN 'done' THEN '{"r": 1}' WHEN 'busy' THEN '{"r": 4}'
                          WHEN 'failed-final' THEN '{"r": 2}' ELSE '{}' END::jsonb, 'first') c
ORDER BY i;

-- 8. at REPEATABLE READ a claim always looks first: a replay after a new key writes nothing
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome, inserted FROM idem_claim('new-9', '{}', 'first');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome, inserted FROM idem_claim('done', '{"r": 1}', 'first');
SELECT txid_current_if_assigned() IS NOT NULL AS wrote;
COMMIT;

-- one row per key, every claimed key pending with its attempt, and the outcomes counted once
SELECT key, state, attempt, count(*) OVER (PARTITION BY key) AS versions
FROM idem_keys WHERE scope = 'first' ORDER BY key;
SELECT claims, inserted, replays, in_progress, takeovers, mismatches FROM idem_stats;

DELETE FROM idem_keys WHERE scope = 'first';
