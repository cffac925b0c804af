-- idempotency, SQL edition: the types, the table and its indexes, exactly as the C edition's
-- install script creates them (docs/contract.md §1), so that a database moves between the
-- editions by dump and restore.

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
    retry_after_s    integer,
    response_body    bytea,
    response_headers jsonb
);

-- The key columns use the "C" collation: keys are printable ASCII, and byte order makes the
-- primary key's comparisons memcmp instead of locale-aware ones. The table churns (insert,
-- update, delete on expiry), so autovacuum is told to visit it early.
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

-- Keys expire roughly in the order they were written: a BRIN summary finds the expired ones.
-- idem_reap summarizes new ranges itself when its caller owns the table.
CREATE INDEX idem_keys_expires_at_idx ON @extschema@.idem_keys
    USING brin (expires_at) WITH (pages_per_range = 32, autosummarize = off);

REVOKE ALL ON @extschema@.idem_keys FROM PUBLIC;
