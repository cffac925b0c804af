--
-- Batch claims for message consumers (1.3): idem_claim_batch and idem_complete_batch. Each key
-- follows idem_claim's and idem_complete's rules; bad input is refused before anything is written.
-- Keys of this file live in scopes 'batch' and 'batch-%'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. A batch of new ids: one row per distinct id, in key order; a repeated id is answered once.
SELECT key, outcome, inserted, attempt, state, response, response_code, retry_after_s,
       expires_at > now() + interval '23 hours' AS default_ttl
FROM idem_claim_batch(ARRAY['m3', 'm1', 'm2', 'm1'], 'batch');
SELECT key, state, attempt, locked_until > now() + interval '50 seconds' AS default_lease
FROM idem_keys WHERE scope = 'batch' ORDER BY key;

-- 2. Finished in one call; the count of keys finished. Per-key responses, one status code.
SELECT idem_complete_batch(ARRAY['m1', 'm2'], 'batch',
                           responses => ARRAY['{"applied": 1}', NULL]::jsonb[], response_code => 201);
SELECT key, state, response, response_code, completed_at IS NOT NULL AS completed, locked_until IS NULL AS no_lease
FROM idem_keys WHERE scope = 'batch' ORDER BY key;

-- 3. A mixed batch: applied ids replay with their stored result, an id another consumer holds
-- (m3: committed pending, live lease) is in_progress with retry_after_s, new ids are claimed.
SELECT key, outcome, inserted, attempt, state, response, response_code,
       retry_after_s BETWEEN 1 AND 60 AS retry_after_s
FROM idem_claim_batch(ARRAY['m4', 'm3', 'm2', 'm1', 'm0'], 'batch');
-- in_progress wrote nothing: m3 is unchanged
SELECT attempt, state FROM idem_keys WHERE scope = 'batch' AND key = 'm3';

-- 4. Takeover: an ended lease and a retryable failure are taken over (attempt + 1); a failure
-- that is not retryable replays.
SELECT count(*) FROM idem_claim_batch(ARRAY['t-lease', 't-retry', 't-final'], 'batch-t', lease => '10 ms');
SELECT state FROM idem_fail('t-retry', NULL, 503, true, 'batch-t');
SELECT state FROM idem_fail('t-final', '{"error": "bad"}', 400, false, 'batch-t');
SELECT pg_sleep(0.05);
SELECT key, outcome, inserted, attempt, state, response, response_code
FROM idem_claim_batch(ARRAY['t-retry', 't-lease', 't-final'], 'batch-t');

-- 5. Fencing: completing with the attempt that was taken over is IK002, and the whole call is
-- undone (t-lease, sorted first and finished before t-retry failed, is still pending).
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['t-retry', 't-lease'], 'batch-t',
                                                       attempts => ARRAY[1, 2])$$);
SELECT key, state, attempt FROM idem_keys WHERE scope = 'batch-t' ORDER BY key;
-- the current attempts; NULL skips fencing for that key
SELECT idem_complete_batch(ARRAY['t-retry', 't-lease'], 'batch-t', attempts => ARRAY[2, NULL]);
SELECT key, state, attempt FROM idem_keys WHERE scope = 'batch-t' ORDER BY key;

-- 6. Keys that cannot be finished: missing (IK003), already finished (IK004); all or nothing
-- (f-a, sorted first, was finished before the error and is pending again).
SELECT count(*) FROM idem_claim_batch(ARRAY['f-a', 'f-done'], 'batch-f');
SELECT idem_complete_batch(ARRAY['f-done'], 'batch-f');
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['f-missing', 'f-a'], 'batch-f')$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['f-done', 'f-a'], 'batch-f')$$);
SELECT key, state FROM idem_keys WHERE scope = 'batch-f' ORDER BY key;
-- repeated keys in a completion are a mistake in the caller's list: 22023 naming both places
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['f-a', 'f-b', 'f-a'], 'batch-f')$$);
SELECT key, state FROM idem_keys WHERE scope = 'batch-f' ORDER BY key;

-- 7. Fingerprints, optional per message: stored, compared on retry; a mismatch is IK001 and
-- nothing of the batch is written (the new id p-0, claimed before the mismatch, is undone).
SELECT key, outcome FROM idem_claim_batch(ARRAY['p-1', 'p-2', 'p-3'], 'batch-p',
                                          fingerprints => ARRAY['\x01', NULL, '\x03']::bytea[]);
SELECT key, fingerprint FROM idem_keys WHERE scope = 'batch-p' ORDER BY key;
SELECT idem_complete_batch(ARRAY['p-1', 'p-2', 'p-3'], 'batch-p');
SELECT key, outcome FROM idem_claim_batch(ARRAY['p-1', 'p-2', 'p-3'], 'batch-p',
                                          fingerprints => ARRAY['\x01', NULL, '\x03']::bytea[]);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['p-1', 'p-0'], 'batch-p',
                                                         fingerprints => ARRAY['\x09', NULL]::bytea[])$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['p-0', 'p-2'], 'batch-p',
                                                         fingerprints => ARRAY[NULL, '\x02']::bytea[])$$);
SELECT count(*) AS p_0_absent FROM idem_keys WHERE scope = 'batch-p' AND key = 'p-0';
-- a repeated id with different fingerprints in one batch: IK001 before anything is written
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['p-new', 'p-x', 'p-new'], 'batch-p',
                                                         fingerprints => ARRAY['\x01', NULL, '\x02']::bytea[])$$);
-- the same id twice with the same fingerprint (a redelivery in one poll): one row
SELECT key, outcome, inserted FROM idem_claim_batch(ARRAY['p-new', 'p-new'], 'batch-p',
                                                    fingerprints => ARRAY['\x07', '\x07']::bytea[]);

-- Requests instead of fingerprints, as idem_claim's request: SHA-256 of the scope and the jsonb,
-- so equal JSON is the same request; a given fingerprint takes precedence over a request.
SELECT key, outcome FROM idem_claim_batch(ARRAY['q-1', 'q-2'], 'batch-p',
                                          requests => ARRAY['{"a": 1, "b": [1.0]}', NULL]::jsonb[]);
SELECT outcome FROM idem_claim('q-single', '{"b": [1], "a": 1}', 'batch-p');
SELECT a.fingerprint = b.fingerprint AS same_as_idem_claim
FROM idem_keys a, idem_keys b
WHERE a.scope = 'batch-p' AND a.key = 'q-1' AND b.scope = 'batch-p' AND b.key = 'q-single';
-- the same id twice with equal JSON: one key, no mismatch (in_progress: claimed above, pending)
SELECT key, outcome FROM idem_claim_batch(ARRAY['q-1', 'q-1'], 'batch-p',
                                          requests => ARRAY['{"b": [1], "a": 1}', '{"a": 1, "b": [1.00]}']::jsonb[]);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['q-1'], 'batch-p', requests => ARRAY['{"a": 2}'::jsonb])$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['q-0', 'q-0'], 'batch-p',
                                                         requests => ARRAY['{"a": 1}', '{"a": 2}']::jsonb[])$$);
SELECT key, outcome FROM idem_claim_batch(ARRAY['q-3'], 'batch-p', requests => ARRAY['{"ignored": 1}'::jsonb],
                                          fingerprints => ARRAY['\x05'::bytea]);
SELECT fingerprint FROM idem_keys WHERE scope = 'batch-p' AND key = 'q-3';
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['q-1', 'q-2'], 'batch-p',
                                                         requests => ARRAY['{}'::jsonb])$$);

-- 8. Expiry: an expired id is new again (attempt 1, inserted), a different request is no mismatch.
-- The result's ttl counts from completion.
SELECT count(*) FROM idem_claim_batch(ARRAY['e-1'], 'batch-e', fingerprints => ARRAY['\x01'::bytea]);
SELECT idem_complete_batch(ARRAY['e-1'], 'batch-e', ttl => '10 ms');
SELECT pg_sleep(0.05);
SELECT key, outcome, inserted, attempt, state
FROM idem_claim_batch(ARRAY['e-1'], 'batch-e', fingerprints => ARRAY['\x02'::bytea]);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['e-1'], 'batch-e', ttl => '10 ms')$$);
SELECT pg_sleep(0.05);
-- expired now, so absent (IK003)
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['e-1'], 'batch-e')$$);

-- 9. Re-entrant: the same transaction claiming its own ids again gets them back as claimed
-- (inserted false); wait => '0' never blocks and answers a live lease in_progress at once.
BEGIN;
SELECT key, outcome, inserted FROM idem_claim_batch(ARRAY['r-1', 'r-2'], 'batch-r');
SELECT key, outcome, inserted, attempt FROM idem_claim_batch(ARRAY['r-2', 'r-1'], 'batch-r');
SELECT idem_complete_batch(ARRAY['r-1', 'r-2'], 'batch-r');
SELECT key, outcome, state FROM idem_claim_batch(ARRAY['r-1'], 'batch-r');
COMMIT;
SELECT key, outcome, retry_after_s > 0 AS retry_after_s FROM idem_claim_batch(ARRAY['m3'], 'batch', wait => '0');

-- 10. Empty and NULL.
SELECT count(*) AS rows FROM idem_claim_batch('{}', 'batch');
SELECT idem_complete_batch('{}', 'batch');
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(NULL, 'batch')$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(NULL, 'batch')$$);

-- 11. Bad input: a clear error naming the argument (and the element), nothing written.
SELECT count(*) AS keys_before FROM idem_keys WHERE scope LIKE 'batch%';
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', NULL], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', E'bad\n'], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', ''], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', repeat('k', 256)], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch('[0:1]={ok-1,"bad é"}'::text[], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch('{{ok-1},{ok-2}}'::text[], 'batch')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], NULL)$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], repeat('s', 256))$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', 'ok-2'], 'batch',
                                                         fingerprints => ARRAY['\x01'::bytea])$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1', 'ok-2'], 'batch',
                                                         fingerprints => ARRAY['\x01', '']::bytea[])$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], 'batch',
                                                         fingerprints => ARRAY[sha512('') || '\x00'])$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], 'batch', ttl => '-1 hour')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], 'batch', lease => '0')$$);
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ok-1'], 'batch', wait => '2 hours')$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0', 'm4'], 'batch', attempts => ARRAY[1])$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0', 'm4'], 'batch',
                                                       responses => ARRAY['{}'::jsonb])$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0', 'm4'], 'batch', response_code => NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0', 'm4'], 'batch', ttl => '0')$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0', NULL], 'batch')$$);
SELECT count(*) AS keys_after FROM idem_keys WHERE scope LIKE 'batch%';
SELECT key, state FROM idem_keys WHERE scope = 'batch' AND key IN ('m0', 'm4') ORDER BY key;

-- 12. Privileges as the single calls: SELECT, INSERT and UPDATE on idem_keys for both.
CREATE ROLE regress_idem_batch_rw;
CREATE ROLE regress_idem_batch_ro;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO regress_idem_batch_rw;
GRANT SELECT ON idem_keys TO regress_idem_batch_ro;
SET ROLE regress_idem_batch_ro;
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['priv-1'], 'batch-priv')$$);
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['m0'], 'batch')$$);
RESET ROLE;
SET ROLE regress_idem_batch_rw;
SELECT key, outcome FROM idem_claim_batch(ARRAY['priv-1'], 'batch-priv');
SELECT idem_complete_batch(ARRAY['priv-1'], 'batch-priv');
RESET ROLE;
-- Row-level security applies to the role: the batch takes the policies' path, key by key.
BEGIN;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY batch_tenant ON idem_keys TO regress_idem_batch_rw USING (scope = 'batch-rls');
SET LOCAL ROLE regress_idem_batch_rw;
SELECT key, outcome, inserted FROM idem_claim_batch(ARRAY['rls-2', 'rls-1'], 'batch-rls');
SELECT idem_complete_batch(ARRAY['rls-1', 'rls-2'], 'batch-rls');
SELECT key, outcome, state FROM idem_claim_batch(ARRAY['rls-1', 'rls-3'], 'batch-rls');
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['m1'], 'batch')$$);
ROLLBACK;
DROP OWNED BY regress_idem_batch_rw, regress_idem_batch_ro;
DROP ROLE regress_idem_batch_rw;
DROP ROLE regress_idem_batch_ro;

-- 13. A batch of 10,000 ids: claimed and finished in two calls.
SELECT outcome, inserted, count(*)
FROM idem_claim_batch(array(SELECT 'big-' || g FROM generate_series(1, 10000) g), 'batch-big')
GROUP BY 1, 2;
SELECT idem_complete_batch(array(SELECT 'big-' || g FROM generate_series(1, 10000) g), 'batch-big');
SELECT state, count(*) FROM idem_keys WHERE scope = 'batch-big' GROUP BY 1;
-- 14. applied => true (1.4): each id the call claims is written once, already completed (succeeded,
-- no response, no lease); ids it does not claim are answered as without it.
BEGIN;
SELECT key, outcome, inserted, attempt, state, response, response_code, retry_after_s
FROM idem_claim_batch(ARRAY['ap-2', 'ap-1', 'ap-2'], 'batch-ap', ttl => '1 hour', applied => true);
SELECT key, state, attempt, response, response_code, locked_until, completed_at = claimed_at AS completed_at_claim,
       expires_at = claimed_at + interval '1 hour' AS expires_ttl_after_claim
FROM idem_keys WHERE scope = 'batch-ap' ORDER BY key;
-- finishing a key claimed this way is IK004, as for any finished key; this transaction's own
-- keys replay when claimed again
CALL pg_temp.expect_error($$SELECT idem_complete_batch(ARRAY['ap-1'], 'batch-ap')$$);
SELECT key, outcome, inserted, state FROM idem_claim_batch(ARRAY['ap-1'], 'batch-ap', applied => true);
COMMIT;
-- committed: a later batch, applied or not, sees them applied (replay); a new id is claimed
SELECT key, outcome, inserted, attempt, state FROM idem_claim_batch(ARRAY['ap-3', 'ap-1'], 'batch-ap', applied => true);
SELECT key, outcome, state FROM idem_claim_batch(ARRAY['ap-2'], 'batch-ap');
-- rolled back: nothing of the batch remains, and a new batch claims the ids again
BEGIN;
SELECT count(*) FROM idem_claim_batch(ARRAY['ap-r1', 'ap-r2'], 'batch-ap', applied => true);
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM idem_keys WHERE scope = 'batch-ap' AND key LIKE 'ap-r%';
SELECT key, outcome, inserted FROM idem_claim_batch(ARRAY['ap-r2', 'ap-r1'], 'batch-ap', applied => true);
-- A mixed batch: new (claimed, applied), expired (claimed anew, inserted, attempt 1), an ended
-- lease and a retryable failure (taken over, applied, attempt 2), a final failure and an applied
-- id (replay), a live lease (in_progress, nothing written).
SELECT count(*) FROM idem_claim_batch(ARRAY['mx-lease', 'mx-live', 'mx-retry', 'mx-final', 'mx-exp'], 'batch-mx');
SELECT state FROM idem_release('mx-lease', 1, 'batch-mx');
SELECT state FROM idem_fail('mx-retry', NULL, 503, true, 'batch-mx');
SELECT state FROM idem_fail('mx-final', NULL, 400, false, 'batch-mx');
SELECT idem_complete_batch(ARRAY['mx-exp'], 'batch-mx', ttl => '10 ms');
SELECT pg_sleep(0.05);
SELECT key, outcome, inserted, attempt, state, response_code, retry_after_s IS NOT NULL AS retry_after_s
FROM idem_claim_batch(ARRAY['mx-new', 'mx-live', 'mx-retry', 'mx-final', 'mx-exp', 'mx-lease'], 'batch-mx',
                      applied => true);
SELECT key, state, attempt, response_code, retryable, locked_until IS NULL AS no_lease,
       completed_at IS NOT NULL AS completed
FROM idem_keys WHERE scope = 'batch-mx' ORDER BY key;
-- fingerprints as without applied: stored, and a mismatch is IK001 with nothing written
SELECT key, outcome FROM idem_claim_batch(ARRAY['fp-1'], 'batch-ap', fingerprints => ARRAY['\x01'::bytea],
                                          applied => true);
SELECT fingerprint FROM idem_keys WHERE scope = 'batch-ap' AND key = 'fp-1';
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['fp-0', 'fp-1'], 'batch-ap',
                                                         fingerprints => ARRAY[NULL, '\x02']::bytea[], applied => true)$$);
SELECT count(*) AS fp_0_absent FROM idem_keys WHERE scope = 'batch-ap' AND key = 'fp-0';
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['ap-9'], 'batch-ap', applied => NULL)$$);
-- counted as claims (inserted or taken over) and as completes
SELECT idem_stats_reset();
SELECT count(*) FROM idem_claim_batch(ARRAY['st-1', 'st-2', 'ap-1'], 'batch-ap', applied => true);
SELECT claims, inserted, replays, completes FROM idem_stats;
-- a batch counts once, at its end; one ended by an error still counts what it did (fp-0 claimed,
-- then fp-1's mismatch), as the single calls do
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['fp-0', 'fp-1'], 'batch-ap',
                                                         fingerprints => ARRAY[NULL, '\x02']::bytea[], applied => true)$$);
SELECT claims, inserted, replays, mismatches, completes FROM idem_stats;
SELECT claims, inserted, replays, mismatches, completes FROM idem_scope_stats WHERE scope = 'batch-ap';

-- a batch's insertions share one speculative-insertion token: held by no call that has returned,
-- nor by one that failed after inserting (e-tok inserted, then fp-1's mismatch) in a
-- subtransaction; the transaction goes on inserting with new ones
BEGIN;
SELECT count(*) FROM idem_claim_batch(ARRAY['d-tok', 'c-tok'], 'batch-ap', applied => true);
SELECT count(*) AS tokens_held FROM pg_locks WHERE locktype = 'spectoken' AND pid = pg_backend_pid();
CALL pg_temp.expect_error($$SELECT * FROM idem_claim_batch(ARRAY['fp-1', 'e-tok'], 'batch-ap',
                                                         fingerprints => ARRAY['\x02', NULL]::bytea[], applied => true)$$);
SELECT count(*) AS tokens_held FROM pg_locks WHERE locktype = 'spectoken' AND pid = pg_backend_pid();
SELECT key, outcome, inserted FROM idem_claim_batch(ARRAY['e-tok', 'b-tok'], 'batch-ap', applied => true);
COMMIT;
SELECT key, state FROM idem_keys WHERE scope = 'batch-ap' AND key LIKE '%-tok' ORDER BY key;

-- 15. Which key failed (docs/contract.md §11): an error while a key is handled has a CONTEXT line
-- naming the key and its element of "keys"; an error about the key's state (IK001 to IK004,
-- 22003) and a repeated key carry the key in the error's COLUMN_NAME field; argument errors,
-- raised before any key is handled, carry neither.
CREATE PROCEDURE pg_temp.which_key(sql text)
LANGUAGE plpgsql AS $proc$
DECLARE
    code text;
    col  text;
    ctx  text;
BEGIN
    EXECUTE sql;
    RAISE NOTICE 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, col = COLUMN_NAME, ctx = PG_EXCEPTION_CONTEXT;
    -- the innermost context line is the batch's; PL/pgSQL's own lines follow it
    ctx := split_part(ctx, E'\n', 1);
    RAISE NOTICE '% column_name=% context=%', code, quote_nullable(nullif(col, '')),
                 CASE WHEN ctx LIKE 'while %' THEN ctx ELSE '(none)' END;
END
$proc$;
SELECT count(*) FROM idem_claim_batch(ARRAY['w-1', 'w-2'], 'batch-w', requests => ARRAY['{"n": 1}', '{"n": 2}']::jsonb[]);
SELECT idem_complete_batch(ARRAY['w-2'], 'batch-w');
-- IK001: w-2 stored with another request; element 3 of keys (keys are handled in key order)
CALL pg_temp.which_key($$SELECT * FROM idem_claim_batch(ARRAY['w-0', 'w-1', 'w-2'], 'batch-w',
                         requests => ARRAY['{}', '{"n": 1}', '{"n": 3}']::jsonb[])$$);
-- positions are the array's subscripts, whatever its lower bound
CALL pg_temp.which_key($$SELECT * FROM idem_claim_batch('[0:1]={w-2,w-9}'::text[], 'batch-w',
                         requests => '[0:1]={"{}","{}"}'::jsonb[])$$);
-- a repeat with different requests, found before any key is handled: the key, no context line
CALL pg_temp.which_key($$SELECT * FROM idem_claim_batch(ARRAY['w-5', 'w-5'], 'batch-w',
                         requests => ARRAY['{"n": 1}', '{"n": 2}']::jsonb[])$$);
-- IK003 (w-8 missing), IK004 (w-2 finished), IK002 (w-1 is at attempt 1), a repeat (22023)
CALL pg_temp.which_key($$SELECT idem_complete_batch(ARRAY['w-1', 'w-8'], 'batch-w')$$);
CALL pg_temp.which_key($$SELECT idem_complete_batch(ARRAY['w-1', 'w-2'], 'batch-w')$$);
CALL pg_temp.which_key($$SELECT idem_complete_batch(ARRAY['w-1'], 'batch-w', attempts => ARRAY[2])$$);
CALL pg_temp.which_key($$SELECT idem_complete_batch(ARRAY['w-1', 'w-2', 'w-1'], 'batch-w')$$);
-- 22003: a takeover past the last attempt
UPDATE idem_keys SET attempt = 2147483647, locked_until = now() - interval '1 s'
 WHERE scope = 'batch-w' AND key = 'w-1';
CALL pg_temp.which_key($$SELECT * FROM idem_claim_batch(ARRAY['w-1'], 'batch-w', requests => ARRAY['{"n": 1}']::jsonb[])$$);
-- an argument error names the element in its message; no key was handled
CALL pg_temp.which_key($$SELECT * FROM idem_claim_batch(ARRAY['w-1', E'w\n2'], 'batch-w')$$);
-- nothing was written by the failed calls
SELECT key, state, attempt FROM idem_keys WHERE scope = 'batch-w' ORDER BY key;

DELETE FROM idem_keys WHERE scope LIKE 'batch%';
