-- idempotency 1.1 -> 1.2: the key's whole life (expiry, heartbeats, release, exact responses).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-- New columns, appended: 1.1's columns keep their names and positions. Keys stored by 1.1 have
-- NULL in them (no body, no headers; claimed_at unknown for attempts begun under 1.1).
ALTER TABLE @extschema@.idem_keys
    ADD COLUMN response_body    bytea,
    ADD COLUMN response_headers jsonb,
    ADD COLUMN claimed_at       timestamptz;

ALTER TYPE @extschema@.idem_claim_result
    ADD ATTRIBUTE retry_after_s    integer,
    ADD ATTRIBUTE response_body    bytea,
    ADD ATTRIBUTE response_headers jsonb;

-- autosummarize requests overflow autovacuum's fixed-size queue on a busy table and flood the
-- log; the reaper and idem_reap summarize the new ranges themselves.
ALTER INDEX @extschema@.idem_keys_expires_at_idx SET (autosummarize = off);

-- idem_claim, idem_complete and idem_fail take new arguments: a new signature is a new function.
-- The new ones are created beside the old ones, take over the old ones' EXECUTE grants, and then
-- the old ones are dropped.
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

DO $$
DECLARE
    moved record;
    grant_entry record;
BEGIN
    FOR moved IN
        SELECT old_fn, new_fn, p.proacl
          FROM (VALUES
                ('@extschema@.idem_claim(text, jsonb, text, interval, interval, bytea)'::pg_catalog.regprocedure,
                 '@extschema@.idem_claim(text, jsonb, text, interval, interval, bytea, interval)'::pg_catalog.regprocedure),
                ('@extschema@.idem_complete(text, jsonb, integer, text, integer)'::pg_catalog.regprocedure,
                 '@extschema@.idem_complete(text, jsonb, integer, text, integer, interval, bytea, jsonb)'::pg_catalog.regprocedure),
                ('@extschema@.idem_fail(text, jsonb, integer, boolean, text, integer)'::pg_catalog.regprocedure,
                 '@extschema@.idem_fail(text, jsonb, integer, boolean, text, integer, interval, bytea, jsonb)'::pg_catalog.regprocedure)
               ) AS f(old_fn, new_fn)
          JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) f.old_fn
         WHERE p.proacl IS NOT NULL
    LOOP
        -- NULL proacl is the default (EXECUTE for PUBLIC), which the new function has already.
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', moved.new_fn);
        FOR grant_entry IN
            SELECT a.grantee, a.is_grantable
              FROM pg_catalog.aclexplode(moved.proacl) AS a
             WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
        LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', moved.new_fn,
                CASE WHEN grant_entry.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grant_entry.grantee)) END,
                CASE WHEN grant_entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$$;

DROP FUNCTION @extschema@.idem_claim(text, jsonb, text, interval, interval, bytea);
DROP FUNCTION @extschema@.idem_complete(text, jsonb, integer, text, integer);
DROP FUNCTION @extschema@.idem_fail(text, jsonb, integer, boolean, text, integer);

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

-- Pending keys whose lease has ended and that have not expired: the owner crashed or gave up
-- without a result. security_invoker: the caller's privileges and row-level security policies on
-- idem_keys apply, as if the caller queried the table.
CREATE VIEW @extschema@.idem_stalled WITH (security_invoker = true) AS
    SELECT k.scope, k.key, k.attempt, k.locked_until, k.created_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) k.locked_until AS stalled_for
      FROM @extschema@.idem_keys AS k
     WHERE k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
       AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
       AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
     ORDER BY k.locked_until, k.scope, k.key;
-- Safe for everyone: the caller still needs SELECT on idem_keys, and its policies apply.
GRANT SELECT ON @extschema@.idem_stalled TO PUBLIC;
