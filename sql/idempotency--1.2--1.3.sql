-- idempotency 1.2 -> 1.3: per-scope statistics (docs/contract.md §10) and batch claims for message consumers.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

-- batch claims (message consumers)

-- One call per poll of a queue consumer: each key claimed by idem_claim's rules, one row per
-- distinct key, in the primary key's order (the order every batch takes its keys in, so that
-- overlapping batches never deadlock).
CREATE FUNCTION @extschema@.idem_claim_batch(
    keys         text[],
    scope        text DEFAULT '',
    requests     jsonb[] DEFAULT NULL,
    fingerprints bytea[] DEFAULT NULL,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         interval DEFAULT NULL)
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

-- idem_stats gains dealloc: idem_scope_stats entries of this database evicted to make room.
-- CREATE OR REPLACE appends the column and keeps the grants made on the view.
CREATE FUNCTION @extschema@.idem_stats_dealloc()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_stats_dealloc'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE OR REPLACE VIEW @extschema@.idem_stats AS
    SELECT s.*, @extschema@.idem_stats_dealloc() AS dealloc
      FROM @extschema@.idem_stats_get() AS s;

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
