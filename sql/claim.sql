--
-- idem_claim: every outcome of docs/contract.md §2 (claimed / replay / in_progress / takeover), the result
-- columns, inserted, attempt, the ttl and lease defaults and the expires_at rule.
-- Keys of this file live in scopes 'claim' and 'claim-b' (and keys 'claim-%' in scope '').
-- Never prints timestamps, intervals or fingerprints: only comparisons.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error

-- 1. No row: insert.  outcome claimed, inserted true, attempt 1, pending, nothing stored yet.
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('order-1', '{"amount": 100}', 'claim');
-- the row: lease = 60 s and ttl = 1 day by default, both from the same clock as created_at
SELECT scope, key, state, attempt, fingerprint IS NOT NULL AS has_fingerprint,
       response, response_code, retryable, completed_at,
       locked_until - created_at BETWEEN interval '59 s' AND interval '61 s' AS lease_is_60s,
       expires_at BETWEEN created_at + interval '86399 s'
                      AND created_at + interval '86401 s' AS ttl_is_1_day,
       created_at <= clock_timestamp() AS created_in_past
FROM idem_keys WHERE scope = 'claim' AND key = 'order-1';
-- settings read at call time; SHOW works once the library is loaded
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;
SHOW idempotency.max_key_length;
SHOW idempotency.reaper_batch_size;

-- the claim result's expires_at is the row's
SELECT expires_at AS claim_expires_at
FROM idem_claim('order-2', NULL, 'claim') \gset
SELECT expires_at::text = :'claim_expires_at' AS result_expires_at_is_rows
FROM idem_keys WHERE scope = 'claim' AND key = 'order-2';

-- 2. Same key again while the lease is live: in_progress, inserted false, the current attempt,
-- retry_after = locked_until - clock (> 0, at most the lease), no response; nothing is written
-- (ttl and lease matter only on insert or takeover).
SELECT xmin AS xmin_before, locked_until AS lease_before, expires_at AS expires_before
FROM idem_keys WHERE scope = 'claim' AND key = 'order-1' \gset
SELECT outcome, inserted, attempt, state, response, response_code,
       retry_after > interval '0' AS retry_after_positive,
       retry_after > interval '30 s' AS retry_after_from_lease,
       retry_after <= interval '60 s' AS retry_after_within_lease,
       expires_at::text = :'expires_before' AS expires_at_is_rows
FROM idem_claim('order-1', '{"amount": 100}', 'claim', ttl => '1000 days', lease => '1 hour');
SELECT xmin::text = :'xmin_before' AS row_not_written,
       locked_until::text = :'lease_before' AS lease_unchanged,
       expires_at::text = :'expires_before' AS expires_at_unchanged
FROM idem_keys WHERE scope = 'claim' AND key = 'order-1';

-- 3. Completed: replay with the stored state, response and code, inserted false, no retry_after;
-- nothing is written, a new ttl is ignored.
SELECT state, attempt, response, response_code
FROM idem_complete('order-1', '{"id": 7, "status": "paid"}', 201, 'claim');
SELECT xmin AS xmin_before, expires_at AS expires_before
FROM idem_keys WHERE scope = 'claim' AND key = 'order-1' \gset
SELECT outcome, inserted, attempt, state, response, response_code, retry_after,
       expires_at::text = :'expires_before' AS expires_at_is_rows
FROM idem_claim('order-1', '{"amount": 100}', 'claim', ttl => '1000 days');
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('order-1', '{"amount": 100}', 'claim');
SELECT xmin::text = :'xmin_before' AS row_not_written,
       expires_at::text = :'expires_before' AS expires_at_unchanged
FROM idem_keys WHERE scope = 'claim' AND key = 'order-1';
-- a JSON null response is replayed as JSON null (not SQL NULL)
SELECT outcome FROM idem_claim('order-2', NULL, 'claim');
SELECT state, response IS NULL AS sql_null, response FROM idem_complete('order-2', 'null', 204, 'claim');
SELECT outcome, inserted, state, response IS NULL AS sql_null, response, response_code
FROM idem_claim('order-2', NULL, 'claim');

-- 4. Failed with retryable = false: replay of the failure.
SELECT outcome, inserted, attempt FROM idem_claim('final-1', NULL, 'claim');
SELECT state, attempt, response, response_code, retryable
FROM idem_fail('final-1', '{"error": "card declined"}', 402, false, 'claim');
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('final-1', NULL, 'claim');
-- a non-retryable failure without a response replays a NULL response
SELECT outcome FROM idem_claim('final-2', NULL, 'claim');
SELECT state, response, response_code, retryable
FROM idem_fail('final-2', retryable => false, scope => 'claim');
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('final-2', NULL, 'claim');

-- 5. Pending with an expired lease: takeover.  attempt + 1, new lease, outcome claimed,
-- inserted false; created_at and fingerprint kept; expires_at = greatest(old, clock + ttl).
SELECT outcome, inserted, attempt
FROM idem_claim('lease-1', '{"n": 1}', 'claim', lease => '10 ms');
SELECT created_at AS created_before, fingerprint AS fp_before, expires_at AS expires_before
FROM idem_keys WHERE scope = 'claim' AND key = 'lease-1' \gset
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt, state, response, response_code, retry_after,
       expires_at > :'expires_before'::timestamptz AS expires_at_extended
FROM idem_claim('lease-1', '{"n": 1}', 'claim');
SELECT state, attempt, response, response_code, retryable, completed_at,
       created_at::text = :'created_before' AS created_at_kept,
       fingerprint::text = :'fp_before' AS fingerprint_kept,
       locked_until - clock_timestamp() BETWEEN interval '30 s' AND interval '60 s' AS new_lease_60s,
       expires_at > :'expires_before'::timestamptz AS expires_at_extended
FROM idem_keys WHERE scope = 'claim' AND key = 'lease-1';
-- the new owner's lease is live: the next claim is in_progress at attempt 2
SELECT outcome, inserted, attempt, state, retry_after > interval '0' AS retry_after_positive
FROM idem_claim('lease-1', '{"n": 1}', 'claim');
-- an expired lease again: attempt 3
SELECT outcome, inserted, attempt FROM idem_claim('lease-2', NULL, 'claim', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt FROM idem_claim('lease-2', NULL, 'claim', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt, state FROM idem_claim('lease-2', NULL, 'claim');
-- an abandoned claim finished late by its first owner is still pending: complete works without
-- attempt, and the result is replayed
SELECT outcome, inserted, attempt FROM idem_claim('lease-3', NULL, 'claim', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state, attempt, response_code FROM idem_complete('lease-3', '{}', scope => 'claim');
SELECT outcome, inserted, attempt, state, response_code FROM idem_claim('lease-3', NULL, 'claim');

-- 6. Failed with retryable = true: takeover, attempt + 1; response, response_code, retryable
-- and completed_at cleared.
SELECT outcome, inserted, attempt FROM idem_claim('retry-1', '{"n": 2}', 'claim');
SELECT state, attempt, response, response_code, retryable, completed_at IS NOT NULL AS completed
FROM idem_fail('retry-1', '{"error": "upstream timeout"}', 503, scope => 'claim');
SELECT outcome, inserted, attempt, state, response, response_code, retry_after
FROM idem_claim('retry-1', '{"n": 2}', 'claim');
SELECT state, attempt, response, response_code, retryable, completed_at,
       locked_until > clock_timestamp() AS leased
FROM idem_keys WHERE scope = 'claim' AND key = 'retry-1';
-- fail again (retryable), take over again, then succeed: the success is replayed at attempt 3
SELECT state, attempt, retryable FROM idem_fail('retry-1', scope => 'claim', attempt => 2);
SELECT outcome, inserted, attempt, state FROM idem_claim('retry-1', '{"n": 2}', 'claim');
SELECT state, attempt, response, response_code, retryable
FROM idem_complete('retry-1', '{"ok": true}', scope => 'claim', attempt => 3);
SELECT outcome, inserted, attempt, state, response, response_code
FROM idem_claim('retry-1', '{"n": 2}', 'claim');

-- 7. expires_at is set once and never shortened: a takeover with a shorter ttl keeps it,
-- a takeover with a longer ttl extends it to clock + ttl.
SELECT outcome, inserted, attempt
FROM idem_claim('ttl-1', NULL, 'claim', ttl => '10 days', lease => '10 ms');
SELECT expires_at AS expires_before,
       expires_at BETWEEN created_at + interval '10 days' - interval '1 s'
                      AND created_at + interval '10 days' + interval '1 s' AS ttl_is_10_days
FROM idem_keys WHERE scope = 'claim' AND key = 'ttl-1' \gset
SELECT :'ttl_is_10_days' AS ttl_is_10_days;
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt,
       expires_at::text = :'expires_before' AS result_expires_at_kept
FROM idem_claim('ttl-1', NULL, 'claim', ttl => '1 hour');
SELECT expires_at::text = :'expires_before' AS expires_at_kept
FROM idem_keys WHERE scope = 'claim' AND key = 'ttl-1';
SELECT state FROM idem_fail('ttl-1', scope => 'claim');
SELECT outcome, inserted, attempt,
       expires_at > :'expires_before'::timestamptz AS result_expires_at_extended
FROM idem_claim('ttl-1', NULL, 'claim', ttl => '20 days');
SELECT expires_at > :'expires_before'::timestamptz AS expires_at_extended,
       expires_at BETWEEN clock_timestamp() + interval '20 days' - interval '1 min'
                      AND clock_timestamp() + interval '20 days' AS expires_at_clock_plus_ttl
FROM idem_keys WHERE scope = 'claim' AND key = 'ttl-1';

-- 8. Defaults come from idempotency.default_ttl (seconds) and idempotency.default_lease (ms),
-- read at each call; explicit arguments win.
SET idempotency.default_ttl = '2h';
SET idempotency.default_lease = '90s';
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;
SELECT outcome, inserted FROM idem_claim('guc-1', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('guc-2', NULL, 'claim', ttl => '3 hours', lease => '5 s');
SELECT key,
       expires_at - created_at BETWEEN interval '2 h' - interval '1 s'
                                   AND interval '2 h' + interval '1 s' AS ttl_2h,
       expires_at - created_at BETWEEN interval '3 h' - interval '1 s'
                                   AND interval '3 h' + interval '1 s' AS ttl_3h,
       locked_until - created_at BETWEEN interval '89 s' AND interval '91 s' AS lease_90s,
       locked_until - created_at BETWEEN interval '4 s' AND interval '6 s' AS lease_5s
FROM idem_keys WHERE scope = 'claim' AND key IN ('guc-1', 'guc-2') ORDER BY key;
-- a 10 ms default lease: taken over after a short sleep
SET idempotency.default_lease = 10;
SHOW idempotency.default_lease;
SELECT outcome, inserted, attempt FROM idem_claim('guc-3', NULL, 'claim');
SELECT pg_sleep(0.05);
SELECT outcome, inserted, attempt FROM idem_claim('guc-3', NULL, 'claim');
RESET idempotency.default_ttl;
RESET idempotency.default_lease;
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;

-- 9. The clock is the wall clock at the call (clock_timestamp()), not the transaction start.
BEGIN;
SELECT pg_sleep(0.1);
SELECT outcome, inserted FROM idem_claim('clock-1', NULL, 'claim', lease => '1 s');
SELECT created_at >= now() + interval '0.1 s' AS created_at_is_clock,
       locked_until >= now() + interval '1.1 s' AS lease_from_clock
FROM idem_keys WHERE scope = 'claim' AND key = 'clock-1';
COMMIT;

-- 10. Scope and key: same key in two scopes = two keys; the default scope is ''; keys compare
-- byte for byte (case and trailing spaces matter).
SELECT outcome, inserted FROM idem_claim('shared', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('shared', NULL, 'claim-b');
SELECT outcome, inserted FROM idem_claim('shared', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('claim-default');
SELECT outcome, inserted FROM idem_claim('claim-default', scope => '');
SELECT scope, key, attempt FROM idem_keys WHERE key IN ('shared', 'claim-default') ORDER BY scope, key;
SELECT outcome, inserted FROM idem_claim('Case', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('case', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('case ', NULL, 'claim');
SELECT outcome, inserted FROM idem_claim('case', NULL, 'claim');
SELECT count(*) FROM idem_keys WHERE scope = 'claim' AND lower(key) LIKE 'case%';

-- a claim never raises unique_violation
CALL pg_temp.expect_error($$SELECT idem_claim('shared', NULL, 'claim')$$);

-- 11. The attempt counter cannot wrap around: a takeover at attempt 2147483647 is an error and
-- leaves the key as it was; the owner can still finish it, and it is replayed.
SELECT outcome FROM idem_claim('max-1', NULL, 'claim', lease => '10 ms');
UPDATE idem_keys SET attempt = 2147483647 WHERE scope = 'claim' AND key = 'max-1';
SELECT pg_sleep(0.05);
CALL pg_temp.expect_error($$SELECT idem_claim('max-1', NULL, 'claim')$$);
SELECT state, attempt FROM idem_keys WHERE scope = 'claim' AND key = 'max-1';
SELECT state, attempt FROM idem_complete('max-1', '{}', scope => 'claim', attempt => 2147483647);
SELECT outcome, inserted, attempt FROM idem_claim('max-1', NULL, 'claim');

DELETE FROM idem_keys WHERE scope IN ('claim', 'claim-b') OR (scope = '' AND key LIKE 'claim-%');
