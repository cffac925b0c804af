-- The reaper's cost per key as idem_keys grows (docs/benchmarks.md, "Reaping as the table grows"). For a
-- throwaway database with the extension and an empty idem_keys (bench/run's bench_reap will do):
--   psql -d DB -f bench/reap_growth.sql
-- Six rounds; each appends 20,000 expired keys and 200,000 live ones (autovacuum off for the table
-- meanwhile, so no vacuum summarizes anything), then reaps in batches of 1000 and records the
-- time per reaped key. Then the scan that reaping relies on, with every range unsummarized and
-- after one reap has summarized them.
\set ON_ERROR_STOP 1
DO $$
BEGIN
    IF EXISTS (SELECT FROM idem_keys) THEN
        RAISE EXCEPTION 'idem_keys is not empty: run this in a throwaway database';
    END IF;
END
$$;
ALTER TABLE idem_keys SET (autovacuum_enabled = off);
CREATE TEMP TABLE reap_rounds (round int, table_pages bigint, reaped bigint, ms numeric);
DO $$
DECLARE
    started timestamptz;
    reaped  bigint;
    batch   bigint;
BEGIN
    FOR r IN 1..6 LOOP
        INSERT INTO idem_keys (scope, key, state, attempt, created_at, expires_at)
        SELECT 'growth', 'expired-' || r || '-' || g, 'succeeded', 1, now(), now() - interval '1 hour'
          FROM generate_series(1, 20000) g;
        INSERT INTO idem_keys (scope, key, state, attempt, created_at, expires_at)
        SELECT 'growth', 'live-' || r || '-' || g, 'succeeded', 1, now(), now() + interval '1 day'
          FROM generate_series(1, 200000) g;
        COMMIT;
        started := clock_timestamp();
        reaped := 0;
        LOOP
            batch := idem_reap(1000);
            reaped := reaped + batch;
            COMMIT;
            EXIT WHEN batch < 1000;
        END LOOP;
        INSERT INTO reap_rounds
        VALUES (r, pg_relation_size('idem_keys') / current_setting('block_size')::int, reaped,
                round(extract(epoch FROM clock_timestamp() - started) * 1000, 1));
        COMMIT;
    END LOOP;
END
$$;
SELECT round, table_pages, reaped, ms, round(ms * 1000 / reaped, 2) AS us_per_key
  FROM reap_rounds ORDER BY round;

-- the expiry scan with no range summarized (as after lost autosummarize requests), then after
-- one idem_reap() call
SET enable_seqscan = off;
SELECT count(brin_desummarize_range('idem_keys_expires_at_idx', b))
  FROM generate_series(0, pg_relation_size('idem_keys') / current_setting('block_size')::int, 32) b;
EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM idem_keys WHERE expires_at <= now();
SELECT idem_reap(1);
EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM idem_keys WHERE expires_at <= now();
RESET enable_seqscan;
ALTER TABLE idem_keys RESET (autovacuum_enabled);
TRUNCATE idem_keys;
