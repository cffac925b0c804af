-- Views and statistics. The SQL edition has no shared memory: idem_stats answers one row with
-- every column NULL and idem_scope_stats no rows, as the C edition does without
-- shared_preload_libraries (docs/contract.md §2, §10; docs/editions.md).

-- Pending keys whose lease has ended and that have not expired (§9.4). security_invoker: the
-- caller's privileges and row-level security policies on idem_keys apply.
CREATE VIEW @extschema@.idem_stalled WITH (security_invoker = true) AS
    SELECT k.scope, k.key, k.attempt, k.locked_until, k.created_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) k.locked_until AS stalled_for
      FROM @extschema@.idem_keys AS k
     WHERE k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
       AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
       AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
     ORDER BY k.locked_until, k.scope, k.key;
GRANT SELECT ON @extschema@.idem_stalled TO PUBLIC;

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
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $fn$
    SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::timestamptz, NULL::timestamptz
$fn$;

CREATE FUNCTION @extschema@.idem_stats_dealloc()
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $fn$ SELECT NULL::bigint $fn$;

CREATE VIEW @extschema@.idem_stats AS
    SELECT s.*, @extschema@.idem_stats_dealloc() AS dealloc
      FROM @extschema@.idem_stats_get() AS s;

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$ BEGIN END $fn$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;

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
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $fn$
    SELECT NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::double precision, NULL::double precision, NULL::double precision
     WHERE false
$fn$;

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
GRANT SELECT ON @extschema@.idem_scope_stats TO PUBLIC;

CREATE FUNCTION @extschema@.idem_scope_stats_reset()
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$ BEGIN END $fn$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_scope_stats_reset() FROM PUBLIC;

-- Which edition answers: 'sql' here, 'c' in the C edition.
CREATE FUNCTION @extschema@.idem_edition()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$ SELECT 'sql'::text $fn$;
