-- idempotency 1.2 -> 1.3: per-scope statistics (SPEC §10) and batch claims for message consumers.
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
