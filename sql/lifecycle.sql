--
-- Version 1.2, the key's whole life (docs/contract.md §9): expiry as semantics (9.1), the result's own ttl
-- (9.2), the wait argument's validation (9.3), idem_extend / idem_release / idem_forget and
-- idem_stalled (9.4), retry_after_s (9.5).
-- Keys of this file live in scopes 'lc' and 'lc-%'.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error
-- retry_after_s follows the lease here: the estimate from the scope's work times
-- (idempotency.track) is scope_stats.sql's and TAP 054's subject.
SET idempotency.track = off;

-- 1. An expired key is absent for every function, whether or not the reaper has deleted it.
-- A finished key past its expiry: claimed anew (attempt 1, inserted), even with another request.
SELECT outcome FROM idem_claim('lc-done', '{"a": 1}', 'lc', ttl => '10 ms');
SELECT state FROM idem_complete('lc-done', '{"ok": 1}', scope => 'lc');
SELECT pg_sleep(0.05);
SELECT idem_lookup('lc-done', 'lc') IS NULL AS lookup_absent;
SELECT count(*) AS row_still_there FROM idem_keys WHERE scope = 'lc' AND key = 'lc-done';
CALL pg_temp.expect_error($$SELECT idem_complete('lc-done', '{}', scope => 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('lc-done', scope => 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-done', 1, '1 minute', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_release('lc-done', 1, 'lc')$$);
SELECT outcome, inserted, attempt, state, response, retry_after_s
FROM idem_claim('lc-done', '{"a": "another request"}', 'lc');
SELECT k.state, k.attempt, k.response, k.response_code, k.completed_at,
       k.created_at = k.claimed_at AS fresh_created_at, k.expires_at > now() + interval '23 hours' AS fresh_expiry,
       k.fingerprint = sha256(convert_to('lc', 'UTF8') || '\x00'::bytea || convert_to('{"a": "another request"}', 'UTF8'))
           AS new_fingerprint
FROM idem_keys k WHERE scope = 'lc' AND key = 'lc-done';
-- one row: reused in place
SELECT count(*) FROM idem_keys WHERE scope = 'lc' AND key = 'lc-done';

-- A failed (not retryable) key past its expiry: the same.
SELECT outcome FROM idem_claim('lc-failed', NULL, 'lc', ttl => '10 ms');
SELECT state FROM idem_fail('lc-failed', '{"e": 1}', 400, false, 'lc');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt FROM idem_claim('lc-failed', NULL, 'lc');

-- A pending key whose lease ended past its expiry: claimed anew (attempt 1), not taken over.
SELECT outcome FROM idem_claim('lc-stale', NULL, 'lc', ttl => '10 ms', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT idem_lookup('lc-stale', 'lc') IS NULL AS lookup_absent;
SELECT outcome, inserted, attempt FROM idem_claim('lc-stale', NULL, 'lc');

-- A pending key past its expiry with a live lease is not expired: someone works on it.
SELECT outcome FROM idem_claim('lc-live', '{"x": 1}', 'lc', ttl => '10 ms', lease => '1 hour');
SELECT pg_sleep(0.05);
SELECT (idem_lookup('lc-live', 'lc')).state AS lookup_sees_it;
SELECT outcome, inserted, attempt, retry_after > interval '59 minutes' AS retry_after_ok,
       retry_after_s BETWEEN 3590 AND 3600 AS retry_after_s_ok
FROM idem_claim('lc-live', '{"x": 1}', 'lc');
-- ... and it still compares fingerprints
CALL pg_temp.expect_error($$SELECT idem_claim('lc-live', '{"x": 2}', 'lc')$$);
-- once completed, it is past its expiry and nobody works on it: expired at once
SELECT state FROM idem_complete('lc-live', '{"done": 1}', scope => 'lc');
SELECT idem_lookup('lc-live', 'lc') IS NULL AS lookup_absent;
-- the reaper deletes expired keys to reclaim space; clients see no difference
SELECT idem_reap() >= 1 AS reaped;
SELECT count(*) FROM idem_keys WHERE scope = 'lc' AND key = 'lc-live';

-- 2. The result's own lifetime: expires_at = completed_at + ttl (shorter or longer); NULL: unchanged.
SELECT outcome FROM idem_claim('lc-ttl-short', NULL, 'lc', ttl => '1 day');
SELECT expires_at = completed_at + interval '5 minutes' AS shortened
FROM idem_complete('lc-ttl-short', '{}', scope => 'lc', ttl => '5 minutes');
SELECT outcome FROM idem_claim('lc-ttl-long', NULL, 'lc', ttl => '1 hour');
SELECT expires_at = completed_at + interval '30 days' AS extended
FROM idem_fail('lc-ttl-long', '{"e": 1}', 503, false, 'lc', ttl => '30 days');
SELECT outcome FROM idem_claim('lc-ttl-null', NULL, 'lc', ttl => '1 hour');
SELECT (SELECT expires_at FROM idem_keys WHERE scope = 'lc' AND key = 'lc-ttl-null') =
       (SELECT expires_at FROM idem_complete('lc-ttl-null', '{}', scope => 'lc')) AS unchanged;
-- a short ttl on a result: the key expires with it
SELECT outcome FROM idem_claim('lc-ttl-ms', NULL, 'lc');
SELECT state FROM idem_fail('lc-ttl-ms', NULL, 500, true, 'lc', ttl => '10 ms');
SELECT pg_sleep(0.05);
SELECT idem_lookup('lc-ttl-ms', 'lc') IS NULL AS lookup_absent;
-- bad ttl: 22023 naming "ttl", nothing written
SELECT outcome FROM idem_claim('lc-ttl-bad', NULL, 'lc');
CALL pg_temp.expect_error($$SELECT idem_complete('lc-ttl-bad', '{}', scope => 'lc', ttl => '0')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('lc-ttl-bad', '{}', scope => 'lc', ttl => '-1 day')$$);
CALL pg_temp.expect_error($$SELECT idem_fail('lc-ttl-bad', scope => 'lc', ttl => '101 years')$$);
SELECT state FROM idem_keys WHERE scope = 'lc' AND key = 'lc-ttl-bad';

-- 3. wait: NULL, or 0 .. 1 hour; else 22023 naming "wait". (Waiting itself: isolation specs.)
SELECT outcome FROM idem_claim('lc-wait-null', NULL, 'lc', wait => NULL);
SELECT outcome FROM idem_claim('lc-wait-0', NULL, 'lc', wait => '0');
SELECT outcome FROM idem_claim('lc-wait-1h', NULL, 'lc', wait => '1 hour');
CALL pg_temp.expect_error($$SELECT idem_claim('lc-wait', NULL, 'lc', wait => '-1 ms')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('lc-wait', NULL, 'lc', wait => '1 hour 1 microsecond')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('lc-wait', NULL, 'lc', wait => '1 day')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('lc-wait', NULL, 'lc', wait => '1 mon -30 days 2 hours')$$);

-- 4. idem_extend: the owner's heartbeat, locked_until = clock + lease.
SELECT outcome, attempt FROM idem_claim('lc-hb', NULL, 'lc', lease => '1 second');
SELECT state, attempt, locked_until > now() + interval '9 minutes' AS extended
FROM idem_extend('lc-hb', 1, '10 minutes', 'lc');
SELECT outcome, retry_after_s > 500 AS retry_after_s_follows FROM idem_claim('lc-hb', NULL, 'lc');
-- shortening is allowed too (it is the owner's lease)
SELECT locked_until < now() + interval '1 minute' AS shortened FROM idem_extend('lc-hb', 1, '1 second', 'lc');
-- after the lease ended, as long as nobody took the key over
SELECT outcome FROM idem_claim('lc-hb2', NULL, 'lc', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT attempt, locked_until > now() AS alive_again FROM idem_extend('lc-hb2', 1, '1 minute', 'lc');
SELECT outcome FROM idem_claim('lc-hb2', NULL, 'lc');
-- taken over: the old owner's heartbeat is stale (IK002)
SELECT outcome FROM idem_claim('lc-hb3', NULL, 'lc', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, attempt FROM idem_claim('lc-hb3', NULL, 'lc');
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb3', 1, '1 minute', 'lc')$$);
SELECT attempt FROM idem_extend('lc-hb3', 2, '1 minute', 'lc');
-- finished: IK004; absent: IK003; bad or missing arguments
SELECT state FROM idem_complete('lc-hb3', '{}', scope => 'lc', attempt => 2);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb3', 2, '1 minute', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-none', 1, '1 minute', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', NULL, '1 minute', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', 1, NULL, 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', 1, '0', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', 1, '-5 minutes', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', 1, '1000 years', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend(NULL, 1, '1 minute', 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_extend('lc-hb', 1, '1 minute', NULL)$$);

-- 5. idem_release: the owner gives the key up; the next claim takes it over at once.
SELECT outcome, attempt FROM idem_claim('lc-rel', '{"r": 1}', 'lc', lease => '1 hour');
SELECT state, attempt, locked_until <= clock_timestamp() AS lease_ended, response
FROM idem_release('lc-rel', 1, 'lc');
SELECT outcome, inserted, attempt FROM idem_claim('lc-rel', '{"r": 1}', 'lc');
CALL pg_temp.expect_error($$SELECT idem_release('lc-rel', 1, 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_release('lc-none', 1, 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_release('lc-rel', NULL, 'lc')$$);
SELECT state FROM idem_complete('lc-rel', '{}', scope => 'lc', attempt => 2);
CALL pg_temp.expect_error($$SELECT idem_release('lc-rel', 2, 'lc')$$);

-- 6. idem_stalled: pending keys whose lease ended (not expired), longest stalled first.
SELECT outcome FROM idem_claim('lc-st-a', NULL, 'lc-st', lease => '10 ms');
SELECT pg_sleep(0.02);
SELECT outcome FROM idem_claim('lc-st-b', NULL, 'lc-st', lease => '10 ms');
SELECT outcome FROM idem_claim('lc-st-live', NULL, 'lc-st', lease => '1 hour');
SELECT outcome FROM idem_claim('lc-st-expired', NULL, 'lc-st', lease => '10 ms', ttl => '10 ms');
SELECT outcome FROM idem_claim('lc-st-done', NULL, 'lc-st', lease => '10 ms');
SELECT state FROM idem_complete('lc-st-done', '{}', scope => 'lc-st');
SELECT pg_sleep(0.05);
SELECT scope, key, attempt, stalled_for > interval '0' AS stalled, locked_until < now() AS ended,
       created_at <= locked_until AS created_first
FROM idem_stalled WHERE scope = 'lc-st';
-- a reconciliation job finishes each with its attempt
SELECT state FROM idem_complete('lc-st-a', '{"reconciled": true}', scope => 'lc-st', attempt => 1);
SELECT key FROM idem_stalled WHERE scope = 'lc-st';

-- 7. idem_forget: deletes the key whatever its state; a live lease only with force (IK005).
SELECT outcome FROM idem_claim('lc-fg-done', NULL, 'lc');
SELECT state FROM idem_complete('lc-fg-done', '{}', scope => 'lc');
SELECT idem_forget('lc-fg-done', 'lc') AS forgotten;
SELECT idem_forget('lc-fg-done', 'lc') AS forgotten_again;
SELECT outcome, inserted, attempt FROM idem_claim('lc-fg-done', '{"different": true}', 'lc');
SELECT outcome FROM idem_claim('lc-fg-live', NULL, 'lc', lease => '1 hour');
CALL pg_temp.expect_error($$SELECT idem_forget('lc-fg-live', 'lc')$$);
SELECT state FROM idem_keys WHERE scope = 'lc' AND key = 'lc-fg-live';
SELECT idem_forget('lc-fg-live', 'lc', force => true) AS forced;
SELECT count(*) FROM idem_keys WHERE scope = 'lc' AND key = 'lc-fg-live';
-- a pending key whose lease ended needs no force
SELECT outcome FROM idem_claim('lc-fg-stale', NULL, 'lc', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT idem_forget('lc-fg-stale', 'lc') AS forgotten;
CALL pg_temp.expect_error($$SELECT idem_forget(NULL, 'lc')$$);
CALL pg_temp.expect_error($$SELECT idem_forget('lc-x', NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_forget('lc-x', 'lc', NULL)$$);
CALL pg_temp.expect_error($$SELECT idem_forget(E'bad\tkey', 'lc')$$);

-- 8. retry_after_s: whole seconds, at least 1, at most ceil(retry_after); NULL unless in_progress.
SELECT outcome FROM idem_claim('lc-ra', NULL, 'lc', lease => '2500 ms');
SELECT outcome, retry_after_s BETWEEN 1 AND 3 AS in_range,
       retry_after_s = ceil(extract(epoch FROM retry_after)) AS is_ceil
FROM idem_claim('lc-ra', NULL, 'lc');
SELECT outcome FROM idem_claim('lc-ra-short', NULL, 'lc', lease => '900 ms');
SELECT outcome, retry_after_s FROM idem_claim('lc-ra-short', NULL, 'lc');
SELECT outcome, retry_after_s, retry_after FROM idem_claim('lc-ra-new', NULL, 'lc');
SELECT state FROM idem_complete('lc-ra-new', '{}', scope => 'lc');
SELECT outcome, retry_after_s, retry_after FROM idem_claim('lc-ra-new', NULL, 'lc');

-- 9. A re-entrant claim in the transaction that claimed the key answers what it wrote.
BEGIN;
SELECT outcome, inserted FROM idem_claim('lc-own', NULL, 'lc', ttl => '10 ms', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt FROM idem_claim('lc-own', NULL, 'lc');
ROLLBACK;
