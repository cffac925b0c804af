--
-- The data path under the SQL API (docs/contract.md §7): what each call writes (from the table's own
-- statistics), index and heap consistency after churn (amcheck), large TOASTed responses and
-- requests, the longest keys, and a table whose files are rewritten (TRUNCATE, VACUUM FULL,
-- REINDEX) under the functions.
-- Keys of this file live in scope 'st' (and 'st-%').
-- Nothing here waits on the clock or races it: a lease or ttl meant to be over is 1 microsecond
-- (over before the next statement starts), every other one lasts hours or days, and keys are
-- made expired only inside the transaction that reaps them.
--
\pset null '(null)'
\getenv abs_srcdir PG_ABS_SRCDIR
\set expect_error :abs_srcdir '/sql/expect_error.psql'
\i :expect_error
CREATE EXTENSION IF NOT EXISTS amcheck;
-- idem_reap counts the expired keys of the whole database: start from an empty table, whatever
-- the files run before this one left (a key of theirs could expire while this one runs)
DELETE FROM idem_keys;
-- rows inserted, updated and deleted in idem_keys as counted by the table's statistics; the
-- counts may include earlier transactions not yet reported, so each block compares with the
-- counts at its start (nothing is reported inside a transaction block)
CREATE VIEW pg_temp.writes AS
SELECT n_tup_ins AS inserted, n_tup_upd AS updated, n_tup_del AS deleted
FROM pg_stat_xact_user_tables WHERE relid = 'idem_keys'::regclass;

-- 1. What is written: an insert per new key, one update per complete, fail or takeover, one
-- delete per reaped key, and nothing for replay, in_progress, lookup, a re-entrant claim or
-- an error, except that a claim right after one that created its key inserts first (see
-- claim_insert_first.sql): when the key exists, a killed tuple (one insert and one delete in
-- the statistics, nothing visible).
BEGIN;
SELECT inserted AS i0, updated AS u0, deleted AS d0 FROM pg_temp.writes \gset
SELECT outcome, inserted FROM idem_claim('st-1', '{"n": 1}', 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
SELECT outcome, inserted FROM idem_claim('st-1', '{"n": 1}', 'st');
SELECT state FROM idem_lookup('st-1', 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
SELECT state FROM idem_complete('st-1', '{"r": 1}', scope => 'st');
SELECT outcome FROM idem_claim('st-1', '{"n": 1}', 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
COMMIT;
SELECT outcome FROM idem_claim('st-2', NULL, 'st', lease => '1 microsecond');
SELECT outcome FROM idem_claim('st-3', NULL, 'st', lease => '1 hour');
SELECT outcome FROM idem_claim('st-4', NULL, 'st', lease => '1 microsecond');
SELECT state FROM idem_fail('st-4', scope => 'st');
-- replay and in_progress in a later transaction, and errors; the first claim follows st-4's
-- creation, so it inserts first: one killed tuple
BEGIN;
SELECT inserted AS i0, updated AS u0, deleted AS d0 FROM pg_temp.writes \gset
SELECT outcome FROM idem_claim('st-1', '{"n": 1}', 'st');
SELECT outcome FROM idem_claim('st-3', NULL, 'st');
SELECT state FROM idem_lookup('st-3', 'st');
CALL pg_temp.expect_error($$SELECT idem_claim('st-1', '{"n": 2}', 'st')$$);
CALL pg_temp.expect_error($$SELECT idem_claim('st-3', '{"n": 2}', 'st')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('st-1', '{}', scope => 'st')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('st-missing', '{}', scope => 'st')$$);
CALL pg_temp.expect_error($$SELECT idem_complete('st-3', '{}', scope => 'st', attempt => 2)$$);
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
COMMIT;
-- takeover of an expired lease, then fail: one update each
BEGIN;
SELECT inserted AS i0, updated AS u0, deleted AS d0 FROM pg_temp.writes \gset
SELECT outcome, attempt FROM idem_claim('st-2', NULL, 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
SELECT state FROM idem_fail('st-2', scope => 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
COMMIT;
-- takeover of a retryable failure: one update
BEGIN;
SELECT inserted AS i0, updated AS u0, deleted AS d0 FROM pg_temp.writes \gset
SELECT outcome, attempt FROM idem_claim('st-4', NULL, 'st');
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
COMMIT;
-- reap: one delete per key.  (With the library preloaded, a background reaper may visit this
-- database at any moment; a SHARE lock on idem_keys keeps it out until the transaction ends.)
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
SELECT count(*) AS claimed
FROM generate_series(1, 4) g,
     LATERAL idem_claim('st-exp-' || g, NULL, 'st', ttl => '1 microsecond', lease => '1 microsecond') c;
SELECT inserted AS i0, updated AS u0, deleted AS d0 FROM pg_temp.writes \gset
SELECT idem_reap();
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
SELECT idem_reap();
SELECT inserted - :i0 AS inserted, updated - :u0 AS updated, deleted - :d0 AS deleted FROM pg_temp.writes;
COMMIT;

-- 2. Churn, then check the heap, the TOAST table and both indexes (every heap tuple indexed).
-- Of 600 keys, every 5th has a ttl that is over at once, but its live lease keeps it from
-- expiring until it is finished or released, which happens only once a background reaper is
-- locked out; of the others, every 3rd has a lease that is over at once (and is finished all
-- the same, or taken over below).
SELECT count(*) AS claimed
FROM generate_series(1, 600) g,
     LATERAL idem_claim('st-churn-' || g, jsonb_build_object('g', g), 'st-churn',
                        ttl => CASE WHEN g % 5 = 0 THEN interval '1 microsecond' ELSE interval '1 day' END,
                        lease => CASE WHEN g % 3 = 0 AND g % 5 <> 0 THEN interval '1 microsecond'
                                      ELSE interval '1 hour' END) c
WHERE c.inserted;
SELECT count(*) AS completed
FROM generate_series(1, 600, 2) g,
     LATERAL idem_complete('st-churn-' || g, jsonb_build_object('result', g), scope => 'st-churn') c
WHERE g % 5 <> 0;
SELECT count(*) AS failed
FROM generate_series(2, 600, 4) g,
     LATERAL idem_fail('st-churn-' || g, NULL, 503, g % 8 = 2, 'st-churn') c
WHERE g % 5 <> 0;
BEGIN;
LOCK TABLE idem_keys IN SHARE MODE;
-- the keys of the short ttl finished (expired from then on), and every 3rd of those left
-- pending released (expired too); the other 20 keep their live lease, so they do not expire
SELECT count(*) AS completed
FROM generate_series(5, 600, 10) g,
     LATERAL idem_complete('st-churn-' || g, jsonb_build_object('result', g), scope => 'st-churn') c;
SELECT count(*) AS failed
FROM generate_series(10, 600, 20) g,
     LATERAL idem_fail('st-churn-' || g, NULL, 503, g % 8 = 2, 'st-churn') c;
SELECT count(*) AS released
FROM generate_series(60, 600, 60) g, LATERAL idem_release('st-churn-' || g, 1, 'st-churn') c;
SELECT idem_reap(50);
SELECT idem_reap();
-- the reaped keys are claimed anew (so would the expired ones be, reaped or not)
SELECT c.outcome, c.inserted, c.attempt, count(*)
FROM generate_series(1, 600) g,
     LATERAL idem_claim('st-churn-' || g, jsonb_build_object('g', g), 'st-churn', ttl => '2 days') c
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
SELECT state, count(*) FROM idem_keys WHERE scope = 'st-churn' GROUP BY 1 ORDER BY 1;
COMMIT;
SELECT bt_index_check('idem_keys_pkey', true);
SELECT bt_index_parent_check('idem_keys_pkey', true);
SELECT count(*) AS heap_corruption FROM verify_heapam('idem_keys');
-- index scans agree with the heap: the same rows through either index as through the heap
SET enable_indexscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS heap_rows FROM idem_keys \gset
RESET enable_indexscan;
SET enable_seqscan = off;
SET enable_indexonlyscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idem_keys WHERE scope >= '';
SELECT count(*) = :heap_rows AS pkey_scan_complete FROM idem_keys WHERE scope >= '';
RESET enable_seqscan;
RESET enable_bitmapscan;
RESET enable_indexonlyscan;
-- the expires_at index is a BRIN summary (amcheck has none for BRIN in PostgreSQL 15): a bitmap
-- scan through it finds every row, before and after summarizing the new ranges
SET enable_seqscan = off;
SET enable_indexscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idem_keys WHERE expires_at > '-infinity';
SELECT count(*) = :heap_rows AS expires_at_scan_complete FROM idem_keys WHERE expires_at > '-infinity';
SELECT brin_summarize_new_values('idem_keys_expires_at_idx') >= 0 AS summarized;
SELECT count(*) = :heap_rows AS expires_at_scan_complete FROM idem_keys WHERE expires_at > '-infinity';
RESET enable_seqscan;
RESET enable_indexscan;
-- the expires_at index follows a takeover that moves expires_at
SELECT outcome FROM idem_claim('st-move', NULL, 'st', ttl => '1 hour', lease => '1 microsecond');
SELECT outcome, attempt FROM idem_claim('st-move', NULL, 'st', ttl => '3 days');
SET enable_seqscan = off;
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
EXPLAIN (COSTS OFF)
SELECT key FROM idem_keys WHERE expires_at > now() + interval '2 days' AND expires_at < now() + interval '4 days';
SELECT key FROM idem_keys WHERE expires_at > now() + interval '2 days' AND expires_at < now() + interval '4 days';
-- no index entry left at the old expiry that would still lead to the row
SELECT count(*) AS stale_entries
FROM (SELECT key FROM idem_keys WHERE expires_at < now() + interval '2 hours' OFFSET 0) s
WHERE key = 'st-move';
RESET enable_seqscan;
RESET enable_indexscan;
RESET enable_indexonlyscan;

-- 3. Large values: a TOASTed response is stored and replayed whole; a large request is
-- fingerprinted like any other; a TOASTed response is dropped by a takeover.
CREATE TEMP TABLE big AS
SELECT jsonb_build_object('blob', string_agg(md5(i::text), '' ORDER BY i)) AS doc
FROM generate_series(1, 20000) i;
SELECT pg_column_size(doc) > 100000 AS large FROM big;
SELECT outcome FROM idem_claim('st-big', (SELECT doc FROM big), 'st');
SELECT fingerprint = sha256(convert_to('st', 'UTF8') || '\x00'::bytea
                            || convert_to((SELECT doc FROM big)::text, 'UTF8')) AS big_fingerprint
FROM idem_keys WHERE scope = 'st' AND key = 'st-big';
SELECT state, response = (SELECT doc FROM big) AS stored_whole
FROM idem_complete('st-big', (SELECT doc FROM big), scope => 'st');
SELECT outcome, response = (SELECT doc FROM big) AS replayed_whole,
       md5(response::text) = (SELECT md5(doc::text) FROM big) AS same_text
FROM idem_claim('st-big', (SELECT doc FROM big), 'st');
SELECT response = (SELECT doc FROM big) AS looked_up_whole FROM idem_lookup('st-big', 'st');
SELECT outcome FROM idem_claim('st-big-2', NULL, 'st');
SELECT state, response = (SELECT doc FROM big) AS stored_whole
FROM idem_fail('st-big-2', (SELECT doc FROM big), 503, true, 'st');
SELECT outcome, attempt, response FROM idem_claim('st-big-2', NULL, 'st');
SELECT response IS NULL AS response_dropped FROM idem_lookup('st-big-2', 'st');
SELECT state, response = (SELECT doc FROM big) AS stored_whole
FROM idem_complete('st-big-2', (SELECT doc FROM big), scope => 'st');
SELECT count(*) AS heap_corruption FROM verify_heapam('idem_keys');
DROP TABLE big;

-- 4. The longest key (2000 characters) in the longest scope (255 bytes) fits the primary key.
-- (The SQL edition allows 255 characters at most: its errors here would name lines of its
-- source, which are no part of what is tested.)
\set SHOW_CONTEXT never
SET idempotency.max_key_length = 2000;
SELECT outcome, inserted
FROM idem_claim((SELECT string_agg(md5(i::text), '' ORDER BY i) FROM generate_series(1, 63) i)::varchar(2000),
                '{"long": true}', 'st-' || repeat('l', 252));
SELECT state
FROM idem_complete((SELECT string_agg(md5(i::text), '' ORDER BY i) FROM generate_series(1, 63) i)::varchar(2000),
                   '{}', scope => 'st-' || repeat('l', 252));
SELECT outcome, inserted
FROM idem_claim((SELECT string_agg(md5(i::text), '' ORDER BY i) FROM generate_series(1, 63) i)::varchar(2000),
                '{"long": true}', 'st-' || repeat('l', 252));
SELECT length(key) AS key_length, octet_length(scope) AS scope_bytes, state
FROM idem_keys WHERE scope = 'st-' || repeat('l', 252);
RESET idempotency.max_key_length;
\set SHOW_CONTEXT errors
SELECT bt_index_check('idem_keys_pkey', true);

-- 5. The table's files rewritten under the functions (same session, nothing cached).
SELECT outcome, inserted FROM idem_claim('st-rw-1', NULL, 'st', lease => '1 hour');
VACUUM FULL idem_keys;
SELECT outcome, inserted FROM idem_claim('st-rw-1', NULL, 'st');
SELECT state FROM idem_complete('st-rw-1', '{}', scope => 'st');
REINDEX TABLE idem_keys;
SELECT outcome, inserted FROM idem_claim('st-rw-1', NULL, 'st');
SELECT outcome, inserted FROM idem_claim('st-rw-2', NULL, 'st', lease => '1 hour');
CLUSTER idem_keys USING idem_keys_pkey;
SELECT state FROM idem_lookup('st-rw-2', 'st');
VACUUM idem_keys;
SELECT outcome, inserted FROM idem_claim('st-rw-2', NULL, 'st');
SELECT bt_index_check('idem_keys_pkey', true);
-- TRUNCATE in a transaction that rolls back, then for real
BEGIN;
TRUNCATE idem_keys;
SELECT idem_lookup('st-rw-1', 'st') IS NULL AS gone;
SELECT outcome, inserted FROM idem_claim('st-rw-1', NULL, 'st');
ROLLBACK;
SELECT state FROM idem_lookup('st-rw-1', 'st');
SELECT outcome, inserted FROM idem_claim('st-rw-1', NULL, 'st');
DELETE FROM idem_keys WHERE scope LIKE 'st%';
SELECT count(*) AS heap_corruption FROM verify_heapam('idem_keys');
SELECT bt_index_check('idem_keys_pkey', true);

DROP VIEW pg_temp.writes;
DROP EXTENSION amcheck;
