-- idempotency 1.0 -> 1.1: a more compact idem_keys (see idempotency--1.1.sql).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- Complete and fail update in place once pruning has removed a key's pending version, so the
-- 15% reserved by fillfactor 85 only left pages half empty. Pages written from now on fill up;
-- VACUUM FULL (or pg_repack) compacts the existing ones.
ALTER TABLE @extschema@.idem_keys RESET (fillfactor);

-- A BRIN summary of expires_at instead of a btree entry per key.
DROP INDEX @extschema@.idem_keys_expires_at_idx;
CREATE INDEX idem_keys_expires_at_idx ON @extschema@.idem_keys
    USING brin (expires_at) WITH (pages_per_range = 32, autosummarize = on);

-- 1.0's idem_reap_all resolved its operators through the caller's search_path.
-- Commits after each batch, so it must be called outside an explicit transaction block.
-- No SET clause (a procedure with one cannot commit): every name is schema-qualified instead, the
-- operators included, so that nothing on the caller's search_path can stand in for them.
CREATE OR REPLACE PROCEDURE @extschema@.idem_reap_all(
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
