-- idempotency 1.6: idempotency keys for safe retries.
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

CREATE TYPE @extschema@.idem_state AS ENUM ('pending', 'succeeded', 'failed');
CREATE TYPE @extschema@.idem_outcome AS ENUM ('claimed', 'replay', 'in_progress');

CREATE TYPE @extschema@.idem_claim_result AS (
    outcome       @extschema@.idem_outcome,
    inserted      boolean,
    attempt       integer,
    state         @extschema@.idem_state,
    response      jsonb,
    response_code integer,
    retry_after   interval,
    expires_at    timestamptz,
    -- 1.2, appended so that positional readers of 1.1's attributes keep working
    retry_after_s    integer,
    response_body    bytea,
    response_headers jsonb
);

-- The key columns use the "C" collation: keys are printable ASCII, and byte order makes the
-- primary key's comparisons memcmp instead of locale-aware ones.
-- The default fillfactor (100) keeps the table compact: complete and fail still update in place
-- (HOT) once page pruning has removed a key's pending version. The table churns (insert, update,
-- delete on expiry), so autovacuum is told to visit it early.
CREATE TABLE @extschema@.idem_keys (
    scope         text COLLATE pg_catalog."C" NOT NULL DEFAULT '',
    key           text COLLATE pg_catalog."C" NOT NULL,
    state         @extschema@.idem_state NOT NULL,
    attempt       integer NOT NULL,
    fingerprint   bytea,
    response      jsonb,
    response_code integer,
    retryable     boolean,
    created_at    timestamptz NOT NULL,
    locked_until  timestamptz,
    completed_at  timestamptz,
    expires_at    timestamptz NOT NULL,
    response_body    bytea,
    response_headers jsonb,
    claimed_at       timestamptz,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, key)
) WITH (autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_analyze_scale_factor = 0.05);

-- The reaper finds expired keys through a BRIN summary of expires_at: keys expire roughly in the
-- order they were written, so a few bytes per range of pages replace a btree entry per key.
-- autosummarize is off: its requests overflow autovacuum's fixed-size queue on a busy table and
-- flood the log; the reaper and idem_reap summarize the new ranges themselves.
CREATE INDEX idem_keys_expires_at_idx ON @extschema@.idem_keys
    USING brin (expires_at) WITH (pages_per_range = 32, autosummarize = off);

REVOKE ALL ON @extschema@.idem_keys FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_keys', '');

CREATE FUNCTION @extschema@.idem_claim(
    key         text,
    request     jsonb DEFAULT NULL,
    scope       text DEFAULT '',
    ttl         interval DEFAULT NULL,
    lease       interval DEFAULT NULL,
    fingerprint bytea DEFAULT NULL,
    wait        interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete(
    key           text,
    response      jsonb,
    response_code integer DEFAULT 200,
    scope         text DEFAULT '',
    attempt       integer DEFAULT NULL,
    ttl           interval DEFAULT NULL,
    body          bytea DEFAULT NULL,
    headers       jsonb DEFAULT NULL)
RETURNS @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_fail(
    key           text,
    response      jsonb DEFAULT NULL,
    response_code integer DEFAULT 500,
    retryable     boolean DEFAULT true,
    scope         text DEFAULT '',
    attempt       integer DEFAULT NULL,
    ttl           interval DEFAULT NULL,
    body          bytea DEFAULT NULL,
    headers       jsonb DEFAULT NULL)
RETURNS @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lookup(
    key   text,
    scope text DEFAULT '')
RETURNS @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_extend(
    key     text,
    attempt integer,
    lease   interval,
    scope   text DEFAULT '')
RETURNS @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_release(
    key     text,
    attempt integer,
    scope   text DEFAULT '')
RETURNS @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_forget(
    key   text,
    scope text DEFAULT '',
    force boolean DEFAULT false)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- 1.5: true, or IK006 for a role that the recorded row-level security (idem_row_security,
-- idem_policies) would confine while idem_keys lacks it; idem_stalled checks it.
CREATE FUNCTION @extschema@.idem_row_security_check()
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_row_security_check'
LANGUAGE C STABLE PARALLEL RESTRICTED;

-- Pending keys whose lease has ended and that have not expired: the owner crashed or gave up
-- without a result. security_invoker: the caller's privileges and row-level security policies on
-- idem_keys apply, as if the caller queried the table.
CREATE VIEW @extschema@.idem_stalled WITH (security_invoker = true) AS
    SELECT k.scope, k.key, k.attempt, k.locked_until, k.created_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) k.locked_until AS stalled_for
      FROM @extschema@.idem_keys AS k
     WHERE @extschema@.idem_row_security_check()
       AND k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
       AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
       AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
     ORDER BY k.locked_until, k.scope, k.key;
-- Safe for everyone: the caller still needs SELECT on idem_keys, and its policies apply.
GRANT SELECT ON @extschema@.idem_stalled TO PUBLIC;

CREATE FUNCTION @extschema@.idem_reap(max_rows integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_reap'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Commits after each batch, so it must be called outside an explicit transaction block.
-- No SET clause (a procedure with one cannot commit): every name is schema-qualified instead, the
-- operators included, so that nothing on the caller's search_path can stand in for them.
CREATE PROCEDURE @extschema@.idem_reap_all(
    batch_size integer DEFAULT NULL,
    INOUT reaped bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    n bigint;
BEGIN
    IF batch_size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'argument "batch_size" must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    reaped := 0;
    LOOP
        -- the first call loads the library, which defines the batch-size setting
        n := @extschema@.idem_reap(batch_size);
        reaped := reaped OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.<) coalesce(batch_size,
            pg_catalog.current_setting('idempotency.reaper_batch_size')::pg_catalog.int4);
    END LOOP;
END
$$;

-- Statistics (shared memory: with shared_preload_libraries = 'idempotency'; otherwise the view
-- answers with NULL counters). Counters are per database, since the last reset or server start.
CREATE FUNCTION @extschema@.idem_stats_get(
    OUT claims       bigint,
    OUT inserted     bigint,
    OUT replays      bigint,
    OUT in_progress  bigint,
    OUT takeovers    bigint,
    OUT mismatches   bigint,
    OUT completes    bigint,
    OUT fails        bigint,
    OUT reaped       bigint,
    OUT reaper_runs  bigint,
    OUT last_reap_at timestamptz,
    OUT stats_reset  timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_get'
LANGUAGE C VOLATILE PARALLEL SAFE;

-- dealloc: idem_scope_stats entries of this database evicted to make room.
CREATE FUNCTION @extschema@.idem_stats_dealloc()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_stats_dealloc'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_stats AS
    SELECT s.*, @extschema@.idem_stats_dealloc() AS dealloc
      FROM @extschema@.idem_stats_get() AS s;

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
-- like pg_stat_reset(): superuser only unless granted
REVOKE EXECUTE ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;

-- pg_cron scheduling. pg_cron lives in one database (cron.database_name); these functions work
-- when that is this database, and otherwise say what to run there.
CREATE FUNCTION @extschema@.idem_schedule_reaper(schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name text := pg_catalog.left('idempotency reaper: ' || pg_catalog.current_database(), 63);
    command  text := pg_catalog.format('CALL %I.idem_reap_all()', '@extschema@');
    job      bigint;
BEGIN
    IF schedule IS NULL THEN
        RAISE EXCEPTION 'argument "schedule" must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = pg_catalog.format(
                      'In the database where pg_cron is installed (cron.database_name), run: '
                      'SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                      job_name, schedule, command, pg_catalog.current_database());
    END IF;
    EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)'
        INTO job USING job_name, schedule, command, pg_catalog.current_database();
    RETURN job;
END
$$;

CREATE FUNCTION @extschema@.idem_unschedule_reaper()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_name text := pg_catalog.left('idempotency reaper: ' || pg_catalog.current_database(), 63);
    job      bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', pg_catalog.current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = pg_catalog.format(
                      'In the database where pg_cron is installed (cron.database_name), run: '
                      'SELECT cron.unschedule(%L);', job_name);
    END IF;
    EXECUTE 'SELECT jobid FROM cron.job WHERE jobname = $1 AND username = current_user'
        INTO job USING job_name;
    IF job IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT cron.unschedule($1)' USING job;
    RETURN true;
END
$$;

-- batch claims (message consumers)

-- One call per poll of a queue consumer: each key claimed by idem_claim's rules, one row per
-- distinct key, in the primary key's order (the order every batch takes its keys in, so that
-- overlapping batches never deadlock). With applied, each key it claims is written already
-- completed, for a consumer that applies its messages in the claiming transaction.
CREATE FUNCTION @extschema@.idem_claim_batch(
    keys         text[],
    scope        text DEFAULT '',
    requests     jsonb[] DEFAULT NULL,
    fingerprints bytea[] DEFAULT NULL,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         interval DEFAULT NULL,
    applied      boolean DEFAULT false)
RETURNS TABLE (
    key           text,
    outcome       @extschema@.idem_outcome,
    inserted      boolean,
    attempt       integer,
    state         @extschema@.idem_state,
    response      jsonb,
    response_code integer,
    retry_after_s integer,
    expires_at    timestamptz)
AS 'MODULE_PATHNAME', 'idem_claim_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

-- Finishes the keys a batch claimed, all or nothing; returns how many.
CREATE FUNCTION @extschema@.idem_complete_batch(
    keys          text[],
    scope         text DEFAULT '',
    attempts      integer[] DEFAULT NULL,
    responses     jsonb[] DEFAULT NULL,
    response_code integer DEFAULT 200,
    ttl           interval DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_complete_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- per-scope statistics (docs/contract.md §10)

-- The rows the caller may see: every scope of this database for pg_read_all_stats and for roles
-- that may read idem_keys.scope (without row-level security confining them); none for others.
CREATE FUNCTION @extschema@.idem_scope_stats_get(
    OUT scope        text,
    OUT claims       bigint,
    OUT inserted     bigint,
    OUT replays      bigint,
    OUT in_progress  bigint,
    OUT takeovers    bigint,
    OUT mismatches   bigint,
    OUT completes    bigint,
    OUT fails        bigint,
    OUT releases     bigint,
    OUT expired      bigint,
    OUT p50_ms       double precision,
    OUT p90_ms       double precision,
    OUT p99_ms       double precision)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_scope_stats_get'
LANGUAGE C VOLATILE PARALLEL SAFE;

-- oldest_pending_age: read from idem_keys when the column is selected (one scan of the table; a
-- query that does not select it skips the join), for the scopes the function showed.
CREATE VIEW @extschema@.idem_scope_stats AS
    SELECT s.*,
           pg_catalog.now() OPERATOR(pg_catalog.-) p.oldest_created_at AS oldest_pending_age
      FROM @extschema@.idem_scope_stats_get() AS s
      LEFT JOIN (SELECT k.scope, pg_catalog.min(k.created_at) AS oldest_created_at
                   FROM @extschema@.idem_keys AS k
                  WHERE k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                    AND (k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                         OR k.locked_until OPERATOR(pg_catalog.>) pg_catalog.now())
                  GROUP BY k.scope) AS p
        ON p.scope OPERATOR(pg_catalog.=) s.scope COLLATE pg_catalog."C";
-- Safe for everyone: the function shows a role no rows unless it may see every scope.
GRANT SELECT ON @extschema@.idem_scope_stats TO PUBLIC;

CREATE FUNCTION @extschema@.idem_scope_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_scope_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
-- as idem_stats_reset(): superuser only unless granted
REVOKE EXECUTE ON FUNCTION @extschema@.idem_scope_stats_reset() FROM PUBLIC;

-- row-level security that survives dumps and restores (1.5)

-- pg_dump leaves out an extension table's ENABLE ROW LEVEL SECURITY and its policies, but dumps
-- the rows of the extension's configuration tables. These two tables record what idem_keys has
-- (event triggers keep them in step with the DDL that changes it), and their triggers put it back
-- when a restore loads their rows. No row in idem_row_security: row-level security was never
-- enabled. Owner only (they belong to idem_keys' owner and follow it): writing them changes
-- idem_keys' policies.
CREATE TABLE @extschema@.idem_row_security (
    single  boolean PRIMARY KEY DEFAULT true CHECK (single),
    enabled boolean NOT NULL,
    forced  boolean NOT NULL
);
CREATE TABLE @extschema@.idem_policies (
    name       text COLLATE pg_catalog."C" PRIMARY KEY,
    permissive boolean NOT NULL,
    command    text NOT NULL CHECK (command IN ('ALL', 'SELECT', 'INSERT', 'UPDATE', 'DELETE')),
    roles      text[] NOT NULL,      -- role names; {public} for every role
    using_expr text,                 -- as pg_get_expr prints it, names schema-qualified
    check_expr text,
    named      text                  -- the objects the expressions name, with their owners (1.6)
);
REVOKE ALL ON @extschema@.idem_row_security, @extschema@.idem_policies FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_row_security', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_policies', '');


-- Makes idem_keys' row-level security and policies what the two tables record: the flags, every
-- recorded policy (re-created, and refused with IK006 when an object it names is not the one
-- recorded), and no policy the tables do not record. The owner of idem_keys only (checked), like
-- ALTER TABLE. Runs by itself when a restore loads the tables; run it by hand after a data-only
-- restore with --disable-triggers. Returns the number of policies.
CREATE FUNCTION @extschema@.idem_row_security_apply()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_row_security_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A restore loading the tables' rows (COPY fires statement triggers) applies them. A failure
-- there (a policy naming a role the new cluster lacks, say) is a warning, so that the restore
-- goes on; the functions then refuse the roles the policies would confine (IK006) until
-- idem_row_security_apply() succeeds. A write by a role that does not own idem_keys is refused.
CREATE FUNCTION @extschema@.idem_row_security_restore()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_row_security_restore'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_restore() FROM PUBLIC;
CREATE TRIGGER idem_row_security_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_row_security
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
CREATE TRIGGER idem_policies_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_policies
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();

-- DDL that changes idem_keys' row-level security, policies or owner is recorded as it happens, so
-- that the documented ALTER TABLE and CREATE POLICY recipes survive a dump with no step of their
-- own. The function runs as the role that ran the DDL (no SECURITY DEFINER): it decides from the
-- command's parse tree and the objects the command changed (by OID) whether idem_keys was
-- touched, reading nothing else and needing no privilege; only then does it write the record, which
-- only idem_keys' owner can. An ALTER TABLE of idem_keys without a row-level security or owner
-- subcommand (a restore's DISABLE TRIGGER, say) records nothing.
CREATE FUNCTION @extschema@.idem_row_security_ddl()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_row_security_ddl'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_ddl() FROM PUBLIC;
CREATE EVENT TRIGGER idem_row_security_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE POLICY', 'ALTER POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();
CREATE EVENT TRIGGER idem_row_security_drop ON sql_drop
    WHEN TAG IN ('DROP POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();

-- A restore loads idem_keys with COPY, with row_security off. A role that does not own idem_keys
-- cannot restore the record (above), so such a COPY into a table without row-level security is
-- refused: the keys are not loaded rather than loaded readable by every tenant
-- (docs/upgrading.md). The functions'
-- writes fire no trigger; an INSERT statement fires this one for nothing but a check of the
-- command's tag.
CREATE FUNCTION @extschema@.idem_keys_load_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_keys_load_check'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_keys_load_check() FROM PUBLIC;
CREATE TRIGGER idem_keys_load_check
    BEFORE INSERT ON @extschema@.idem_keys
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_keys_load_check();

-- Which edition answers: 'c' here, 'sql' in the SQL edition (sql-edition/), so that a test or an
-- operator can tell them apart; both implement one contract (docs/editions.md).
CREATE FUNCTION @extschema@.idem_edition()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$ SELECT 'c'::text $fn$;
