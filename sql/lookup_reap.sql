--
-- idem_lookup (docs/contract.md §2): the row or NULL, no lock, nothing written.
-- idem_reap: deletes up to max_rows expired keys (expires_at <= clock), never a pending key
-- whose lease is live; returns the count.  idem_reap_all: reaps in batches, one commit each,
-- only outside a transaction block.
-- Keys of this file live in scope 'lr'.  idem_reap looks at every key, so the table is emptied
-- first (every earlier file cleans up after itself anyway).
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error
DELETE FROM idem_keys;

-- 1. idem_lookup: NULL when there is no such key (in that scope).
SELECT idem_lookup('lr-1', 'lr') IS NULL AS no_row;
SELECT key, state FROM idem_lookup('lr-1', 'lr');
SELECT outcome, inserted FROM idem_claim('lr-1', '{"q": 1}', 'lr');
SELECT idem_lookup('lr-1') IS NULL AS not_in_default_scope,
       idem_lookup('lr-1', 'lr2') IS NULL AS not_in_other_scope,
       idem_lookup('LR-1', 'lr') IS NULL AS case_sensitive;
-- the row, as stored: pending
SELECT scope, key, state, attempt, fingerprint IS NOT NULL AS has_fingerprint, response,
       response_code, retryable, locked_until > clock_timestamp() AS leased, completed_at,
       expires_at > clock_timestamp() AS not_expired
FROM idem_lookup('lr-1', 'lr');
SELECT count(*) AS differences FROM (
    (SELECT * FROM idem_lookup('lr-1', 'lr') EXCEPT SELECT * FROM idem_keys WHERE scope = 'lr' AND key = 'lr-1')
    UNION ALL
    (SELECT * FROM idem_keys WHERE scope = 'lr' AND key = 'lr-1' EXCEPT SELECT * FROM idem_lookup('lr-1', 'lr'))
) d;
-- succeeded
SELECT state FROM idem_complete('lr-1', '{"answer": 42}', 200, 'lr');
SELECT state, attempt, response, response_code, retryable, locked_until,
       completed_at IS NOT NULL AS completed
FROM idem_lookup('lr-1', 'lr');
-- the default scope
SELECT outcome FROM idem_claim('lr-default');
SELECT scope, key, state FROM idem_lookup('lr-default');
-- lookup writes nothing and locks nothing: xmin unchanged, xmax still 0 inside the transaction
SELECT xmin AS xmin_before FROM idem_keys WHERE scope = 'lr' AND key = 'lr-1' \gset
BEGIN;
SELECT state FROM idem_lookup('lr-1', 'lr');
SELECT xmin::text = :'xmin_before' AS row_not_written, xmax::text = '0' AS row_not_locked
FROM idem_keys WHERE scope = 'lr' AND key = 'lr-1';
COMMIT;
-- lookup works for any state, also an expired lease or an expired key, and does not change it
SELECT outcome FROM idem_claim('lr-2', NULL, 'lr', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT state, attempt, locked_until < clock_timestamp() AS lease_over FROM idem_lookup('lr-2', 'lr');
SELECT outcome, attempt FROM idem_claim('lr-2', NULL, 'lr');

-- 2. idem_reap: nothing expired -> 0.
SELECT idem_reap();
SELECT idem_reap(1);
SELECT count(*) AS keys FROM idem_keys;

-- With the library preloaded, a background reaper may visit this database at any moment.  Where
-- the exact number of keys reaped by this session matters, the transaction first takes a SHARE
-- lock on idem_keys, which keeps the background reaper out until it ends, and keys meant to
-- expire are given a ttl long enough to be locked before they expire.

-- 3. Expired finished keys are deleted; max_rows bounds each call.
SELECT count(*) AS claimed
FROM generate_series(1, 5) g, LATERAL idem_claim('lr-exp-' || g, NULL, 'lr', ttl => '300 ms') c
WHERE c.inserted;
SELECT count(*) AS completed
FROM generate_series(1, 3) g, LATERAL idem_complete('lr-exp-' || g, '{}', scope => 'lr') c;
SELECT state FROM idem_fail('lr-exp-4', scope => 'lr');
SELECT state FROM idem_fail('lr-exp-5', NULL, 400, false, 'lr');
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT pg_sleep(0.3);
SELECT count(*) AS expired FROM idem_keys WHERE expires_at <= clock_timestamp();
SELECT idem_reap(2);
SELECT idem_reap(2);
SELECT idem_reap(2);
SELECT idem_reap(2);
SELECT key FROM idem_keys ORDER BY scope, key;
COMMIT;
-- a reaped key is new again: inserted, attempt 1
SELECT outcome, inserted, attempt FROM idem_claim('lr-exp-1', NULL, 'lr');
-- max_rows larger than the number of expired keys: returns the number deleted
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT count(*) AS claimed
FROM generate_series(1, 3) g, LATERAL idem_claim('lr-exp-1' || g, NULL, 'lr', ttl => '10 ms') c;
SELECT count(*) AS failed
FROM generate_series(1, 3) g, LATERAL idem_fail('lr-exp-1' || g, scope => 'lr') c;
SELECT pg_sleep(0.02);
SELECT idem_reap(1000);
COMMIT;
-- NULL max_rows: idempotency.reaper_batch_size (1000)
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT count(*) AS claimed
FROM generate_series(1, 3) g, LATERAL idem_claim('lr-exp-2' || g, NULL, 'lr', ttl => '10 ms') c;
SELECT count(*) AS completed
FROM generate_series(1, 3) g, LATERAL idem_complete('lr-exp-2' || g, '{}', scope => 'lr') c;
SELECT pg_sleep(0.02);
SELECT idem_reap(NULL);
SELECT idem_reap();
COMMIT;

-- 4. Pending keys: never deleted while the lease is live, even after expires_at; deleted once
-- the lease is over too.
SELECT outcome FROM idem_claim('lr-live', NULL, 'lr', ttl => '300 ms', lease => '1 hour');
SELECT outcome FROM idem_claim('lr-dead', NULL, 'lr', ttl => '300 ms', lease => '10 ms');
SELECT outcome FROM idem_claim('lr-lease-only', NULL, 'lr', ttl => '1 hour', lease => '10 ms');
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT pg_sleep(0.3);
SELECT key, expires_at <= clock_timestamp() AS expired, locked_until <= clock_timestamp() AS lease_over
FROM idem_keys WHERE key IN ('lr-live', 'lr-dead', 'lr-lease-only') ORDER BY key;
SELECT idem_reap();
SELECT (idem_lookup('lr-live', 'lr')).key IS NOT NULL AS live_kept,
       idem_lookup('lr-dead', 'lr') IS NULL AS dead_reaped,
       (idem_lookup('lr-lease-only', 'lr')).key IS NOT NULL AS unexpired_kept;
SELECT idem_reap();
COMMIT;
-- the live one is still in progress for others, and its owner can finish it; then it is reaped
SELECT outcome, attempt FROM idem_claim('lr-live', NULL, 'lr');
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT state FROM idem_complete('lr-live', '{}', scope => 'lr', attempt => 1);
SELECT idem_reap();
SELECT idem_lookup('lr-live', 'lr') IS NULL AS reaped;
COMMIT;
SELECT count(*) AS keys FROM idem_keys;

-- a key reaped by this transaction can be claimed again in it: a new row, attempt 1
SELECT outcome FROM idem_claim('lr-again', '{"v": 1}', 'lr', ttl => '300 ms', lease => '10 ms');
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT pg_sleep(0.3);
SELECT idem_reap();
SELECT idem_lookup('lr-again', 'lr') IS NULL AS reaped;
CALL pg_temp.expect_error($$SELECT idem_complete('lr-again', '{}', scope => 'lr')$$);
SELECT outcome, inserted, attempt, state FROM idem_claim('lr-again', '{"v": 2}', 'lr');
SELECT outcome, inserted, attempt, state FROM idem_claim('lr-again', '{"v": 2}', 'lr');
COMMIT;
SELECT state, attempt, expires_at > clock_timestamp() + interval '1 hour' AS new_expiry
FROM idem_lookup('lr-again', 'lr');

-- 5. idem_reap in a subtransaction that rolls back deletes nothing.
SELECT count(*) AS claimed
FROM generate_series(1, 3) g, LATERAL idem_claim('lr-rb-' || g, NULL, 'lr', ttl => '300 ms', lease => '10 ms') c;
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT pg_sleep(0.3);
SAVEPOINT s1;
SELECT idem_reap();
SELECT count(*) AS keys FROM idem_keys WHERE key LIKE 'lr-rb-%';
ROLLBACK TO SAVEPOINT s1;
SELECT count(*) AS keys FROM idem_keys WHERE key LIKE 'lr-rb-%';
SELECT idem_reap();
SELECT count(*) AS keys FROM idem_keys WHERE key LIKE 'lr-rb-%';
COMMIT;

-- 6. idem_reap_all: batches until nothing expired is left; reaped is the total.  (It must run
-- outside a transaction block, so no lock here: the keys expire just before the call.)
CALL idem_reap_all();
CALL idem_reap_all(2);
SELECT count(*) AS claimed
FROM generate_series(1, 5) g, LATERAL idem_claim('lr-all-' || g, NULL, 'lr', ttl => '10 ms', lease => '10 ms') c;
SELECT pg_sleep(0.015);
CALL idem_reap_all(2);
SELECT count(*) AS keys FROM idem_keys WHERE key LIKE 'lr-all-%';
-- exactly two full batches (the last batch finds nothing)
SELECT count(*) AS claimed
FROM generate_series(1, 4) g, LATERAL idem_claim('lr-all-' || g, NULL, 'lr', ttl => '10 ms', lease => '10 ms') c;
SELECT pg_sleep(0.015);
CALL idem_reap_all(2);
-- default batch size, and reaped passed in is ignored (the procedure starts from 0)
SELECT count(*) AS claimed
FROM generate_series(1, 3) g, LATERAL idem_claim('lr-all-' || g, NULL, 'lr', ttl => '10 ms', lease => '10 ms') c;
SELECT pg_sleep(0.015);
CALL idem_reap_all(NULL, 100);
-- inside a transaction block it cannot commit: error, and its deletions are rolled back
SELECT count(*) AS claimed
FROM generate_series(1, 3) g, LATERAL idem_claim('lr-all-' || g, NULL, 'lr', ttl => '300 ms', lease => '10 ms') c;
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT pg_sleep(0.3);
SAVEPOINT s1;
\set VERBOSITY sqlstate
CALL idem_reap_all(2);
\set VERBOSITY default
\echo :LAST_ERROR_MESSAGE
ROLLBACK TO SAVEPOINT s1;
SELECT count(*) AS keys FROM idem_keys WHERE key LIKE 'lr-all-%';
SELECT idem_reap();
COMMIT;
-- nothing expired is left
CALL idem_reap_all(2);
SELECT key FROM idem_keys ORDER BY scope, key;

DELETE FROM idem_keys WHERE scope = 'lr' OR (scope = '' AND key LIKE 'lr-%');
