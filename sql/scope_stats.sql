-- idem_scope_stats (docs/contract.md §10): one row per scope of this database, counted at each outcome;
-- idem_scope_stats_reset; who sees which rows; idempotency.track; idem_stats.dealloc.
-- The scopes here are this test's own, but the entries are per database: the test resets them
-- first. Claim-to-finish times depend on the clock: only whether they are there is checked.
-- The suite needs shared_preload_libraries = 'idempotency'; without it the view has no rows
-- (test/t/013_no_preload.pl).
SET client_min_messages = warning;

-- the view's columns
SELECT attname, format_type(atttypid, atttypmod) AS type
FROM pg_attribute WHERE attrelid = 'idem_scope_stats'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname FROM pg_attribute
WHERE attrelid = 'idem_stats'::regclass AND attnum > 0 ORDER BY attnum DESC LIMIT 1;

-- everyone may read the view (it filters), resetting is for superusers unless granted
SELECT has_table_privilege('public', 'idem_scope_stats', 'select') AS public_may_read,
       has_function_privilege('public', 'idem_scope_stats_reset()', 'execute') AS public_may_reset;

SELECT idem_scope_stats_reset();
SELECT count(*) AS rows_after_reset FROM idem_scope_stats;

-- a scripted workload: every counter of scope ss-a, and one claim in ss-b
SELECT outcome, inserted FROM idem_claim('a-1', '{"n": 1}', scope => 'ss-a');      -- inserted
SELECT outcome FROM idem_claim('a-1', '{"n": 1}', scope => 'ss-a');                -- in_progress
SELECT state FROM idem_complete('a-1', '{}', scope => 'ss-a');                     -- complete
SELECT outcome FROM idem_claim('a-1', '{"n": 1}', scope => 'ss-a');                -- replay
SELECT outcome FROM idem_claim('a-1', '{"n": 2}', scope => 'ss-a');                -- mismatch
SELECT outcome FROM idem_claim('a-2', scope => 'ss-a');                            -- inserted
SELECT state FROM idem_fail('a-2', scope => 'ss-a');                               -- fail
SELECT outcome, attempt FROM idem_claim('a-2', scope => 'ss-a');                   -- takeover
SELECT locked_until <= clock_timestamp() AS released
FROM idem_release('a-2', 2, scope => 'ss-a');                                      -- release
SELECT outcome FROM idem_claim('a-3', scope => 'ss-a', ttl => '1 microsecond', lease => '1 microsecond');
SELECT pg_sleep(0.01);
SELECT outcome, inserted FROM idem_claim('a-3', scope => 'ss-a');                  -- expired
SELECT outcome FROM idem_claim('b-1', scope => 'ss-b');
-- errors that are no claim outcome: an invalid argument is not counted at all, a complete of a
-- missing key counts nothing
SELECT outcome FROM idem_claim('', scope => 'ss-a');
SELECT state FROM idem_complete('missing', '{}', scope => 'ss-a');

SELECT scope, claims, inserted, replays, in_progress, takeovers, mismatches, completes, fails,
       releases, expired,
       p50_ms > 0 AND p50_ms <= p90_ms AND p90_ms <= p99_ms AS percentiles_ordered,
       oldest_pending_age >= '0'::interval AS has_pending
FROM idem_scope_stats ORDER BY scope;
-- a scope with no finished attempt has no percentiles
SELECT p50_ms IS NULL AND p90_ms IS NULL AND p99_ms IS NULL AS no_times
FROM idem_scope_stats WHERE scope = 'ss-b';
-- the oldest pending key is b-1's (a-3 too is pending, and younger)
SELECT scope, oldest_pending_age <= clock_timestamp() - created_at AS oldest_is_b1
FROM idem_scope_stats JOIN idem_keys USING (scope) WHERE key = 'b-1';

-- who sees which rows
CREATE ROLE ss_nobody;
CREATE ROLE ss_stats IN ROLE pg_read_all_stats;
CREATE ROLE ss_reader;
GRANT SELECT (scope) ON idem_keys TO ss_reader;
CREATE ROLE ss_tenant;
GRANT SELECT ON idem_keys TO ss_tenant;
SET ROLE ss_nobody;
SELECT count(*) AS nobody_sees FROM idem_scope_stats;
RESET ROLE;
SET ROLE ss_stats;
SELECT count(*) AS pg_read_all_stats_sees FROM idem_scope_stats;
RESET ROLE;
SET ROLE ss_reader;
SELECT count(*) AS scope_reader_sees FROM idem_scope_stats;
RESET ROLE;
-- a role that row-level security confines to some rows sees no scope names
BEGIN;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY ss_own ON idem_keys TO ss_tenant USING (scope = 'ss-b');
SET LOCAL ROLE ss_tenant;
SELECT count(*) AS confined_tenant_sees FROM idem_scope_stats;
ROLLBACK;
SET ROLE ss_tenant;
SELECT count(*) AS tenant_without_rls_sees FROM idem_scope_stats;
-- and may not reset
SELECT idem_scope_stats_reset();
RESET ROLE;

-- idempotency.track is for superusers to change; off: nothing is counted per scope
SET ROLE ss_nobody;
SET idempotency.track = off;
RESET ROLE;
SET idempotency.track = off;
SELECT outcome FROM idem_claim('c-1', scope => 'ss-c');
SELECT state FROM idem_complete('c-1', '{}', scope => 'ss-c');
SELECT count(*) AS untracked FROM idem_scope_stats WHERE scope = 'ss-c';
RESET idempotency.track;

-- reset: every scope of the database goes
SELECT idem_scope_stats_reset();
SELECT count(*) AS rows_after_reset FROM idem_scope_stats;
SELECT outcome FROM idem_claim('a-1', '{"n": 1}', scope => 'ss-a');
SELECT scope, claims, replays FROM idem_scope_stats;

-- a re-entrant claim (this transaction's own pending key) answers claimed and is no outcome:
-- ss-d counts one claim, idem_stats two
SELECT claims AS db_claims_before FROM idem_stats \gset
BEGIN;
SELECT outcome, inserted FROM idem_claim('d-1', scope => 'ss-d');
SELECT outcome, inserted FROM idem_claim('d-1', scope => 'ss-d');
COMMIT;
SELECT claims - :db_claims_before AS db_claims FROM idem_stats;
SELECT claims, inserted, takeovers FROM idem_scope_stats WHERE scope = 'ss-d';

-- clean up
SELECT idem_scope_stats_reset();
DELETE FROM idem_keys WHERE scope IN ('ss-a', 'ss-b', 'ss-c', 'ss-d');
REVOKE ALL ON idem_keys FROM ss_reader, ss_tenant;
DROP ROLE ss_nobody, ss_stats, ss_reader, ss_tenant;
