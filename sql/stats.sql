-- idem_stats and idem_stats_reset; the pg_cron scheduling functions without pg_cron.
-- The counters are per database and shared with every test that ran before in this database,
-- so the test resets them first. The background reaper (when preloaded) may run a batch at any
-- time: reaped, reaper_runs and last_reap_at are only checked as lower bounds.
-- The suite needs shared_preload_libraries = 'idempotency'; without it every counter is NULL
-- (test/t/013_no_preload.pl).
SET client_min_messages = warning;

-- the view's columns
SELECT attname, format_type(atttypid, atttypmod) AS type
FROM pg_attribute WHERE attrelid = 'idem_stats'::regclass AND attnum > 0 ORDER BY attnum;

-- resetting is for superusers unless granted, like pg_stat_reset()
SELECT has_function_privilege('public', 'idem_stats_reset()', 'execute') AS public_may_reset,
       has_function_privilege('public', 'idem_stats_get()', 'execute') AS public_may_read;

SELECT idem_stats_reset();
SELECT claims, inserted, replays, in_progress, takeovers, mismatches, completes, fails,
       stats_reset > now() - interval '1 hour' AS reset_just_now
FROM idem_stats;

-- one of each outcome, in a scope of its own
SELECT outcome, inserted FROM idem_claim('st-1', '{"a": 1}', scope => 'stats');   -- inserted
SELECT outcome, inserted FROM idem_claim('st-1', '{"a": 1}', scope => 'stats');   -- in_progress
SELECT state FROM idem_complete('st-1', '{"ok": true}', scope => 'stats');        -- complete
SELECT outcome, inserted FROM idem_claim('st-1', '{"a": 1}', scope => 'stats');   -- replay
SELECT outcome FROM idem_claim('st-1', '{"a": 2}', scope => 'stats');             -- mismatch
SELECT outcome, inserted FROM idem_claim('st-2', scope => 'stats');               -- inserted
SELECT state FROM idem_fail('st-2', scope => 'stats');                            -- fail (retryable)
SELECT outcome, inserted, attempt FROM idem_claim('st-2', scope => 'stats');      -- takeover
-- an argument error is not a claim: not counted
SELECT outcome FROM idem_claim('', scope => 'stats');
SELECT claims, inserted, replays, in_progress, takeovers, mismatches, completes, fails
FROM idem_stats;

-- complete/fail errors are not counted
SELECT state FROM idem_complete('st-1', '{}', scope => 'stats');
SELECT completes, fails FROM idem_stats;

-- reaping: an expired key, deleted by idem_reap here or by the background reaper
SELECT outcome FROM idem_claim('st-3', scope => 'stats', ttl => '1 microsecond', lease => '1 microsecond');
SELECT pg_sleep(0.01);
SELECT idem_reap() >= 0 AS reaped_here;
SELECT idem_lookup('st-3', 'stats') IS NULL AS gone;
SELECT reaped >= 1 AS reaped, reaper_runs >= 1 AS reaper_ran, last_reap_at >= stats_reset AS reaped_after_reset
FROM idem_stats;

-- reset again: back to zero
SELECT idem_stats_reset();
SELECT claims, inserted, replays, in_progress, takeovers, mismatches, completes, fails
FROM idem_stats;

-- without pg_cron in this database: an error that says what to run where pg_cron is
SELECT count(*) AS pg_cron_here FROM pg_extension WHERE extname = 'pg_cron';
SELECT idem_schedule_reaper();
SELECT idem_schedule_reaper('*/5 * * * *');
SELECT idem_schedule_reaper(NULL);
SELECT idem_unschedule_reaper();

-- clean up
DELETE FROM idem_keys WHERE scope = 'stats';
RESET client_min_messages;
