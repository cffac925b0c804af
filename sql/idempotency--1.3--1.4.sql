-- idempotency 1.3 -> 1.4: idem_claim_batch(..., applied), one row version per consumed message.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- A new trailing parameter is a new signature to PostgreSQL: the new function is created, takes
-- the old one's EXECUTE privileges (1.3 gives it the default, EXECUTE to PUBLIC; a database may
-- have changed them), and the old one is dropped.
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

DO $$
DECLARE
    old_fn pg_catalog.regprocedure :=
        '@extschema@.idem_claim_batch(text[], text, jsonb[], bytea[], interval, interval, interval)';
    new_fn pg_catalog.regprocedure :=
        '@extschema@.idem_claim_batch(text[], text, jsonb[], bytea[], interval, interval, interval, boolean)';
    old_acl pg_catalog.aclitem[] := (SELECT proacl FROM pg_catalog.pg_proc WHERE oid OPERATOR(pg_catalog.=) old_fn);
    grant_entry record;
BEGIN
    -- NULL proacl is the default (EXECUTE for PUBLIC), which the new function has already.
    IF old_acl IS NULL THEN
        RETURN;
    END IF;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', new_fn);
    FOR grant_entry IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(old_acl) AS a
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', new_fn,
            CASE WHEN grant_entry.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grant_entry.grantee)) END,
            CASE WHEN grant_entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

DROP FUNCTION @extschema@.idem_claim_batch(text[], text, jsonb[], bytea[], interval, interval, interval);
