-- Partition side of the scale-out setup: run once in each partition's database, after
-- CREATE EXTENSION idempotency (version 1.2, any schema). Creates schema idem_partition:
--   config                 which partition this database is (index, count) and whether it accepts calls
--   idem_scope_hash(scope) / idem_scope_partition(scope, partitions)  the routing rule (same as the proxy's)
--   idem_claim, idem_complete, idem_fail, idem_extend, idem_release, idem_forget, idem_lookup,
--   idem_claim_batch, idem_complete_batch (these two need extension 1.3; applied => true, 1.4)
--                          the extension's functions behind an ownership check: a call for a
--                          scope that is not this partition's raises IK900
--   configure(...), stats(), stalled()  for the generator, the resharding tool and monitoring
-- The proxy calls these functions (PL/Proxy TARGET); applications that connect to a partition
-- directly (same-transaction mode) call them too, so that a resharding can never let a moved scope
-- be claimed in two places.
\set ON_ERROR_STOP on

CREATE SCHEMA idem_partition;

-- The routing rule: the first four bytes of SHA-256 of the scope's bytes, as a big-endian signed
-- integer. PL/Proxy keeps its low bits (hash & (partitions - 1)). Written in SQL on builtins so
-- that it never changes with a PostgreSQL release (hashtext may) and any language can compute it.
CREATE FUNCTION idem_partition.idem_scope_hash(scope text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ('x' || left(encode(sha256(textsend(scope)), 'hex'), 8))::bit(32)::integer;

CREATE FUNCTION idem_partition.idem_scope_partition(scope text, partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN idem_partition.idem_scope_hash(scope) & (partitions - 1);

CREATE TABLE idem_partition.config (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition  integer NOT NULL,
    partitions integer NOT NULL,
    accepting  boolean NOT NULL,
    -- the resharding that configured this partition as a new one (idem_scaleout.py reshard):
    -- a run that failed recognises its own leftovers by it, and refuses anyone else's
    resharding text,
    CHECK (partitions > 0 AND partitions & (partitions - 1) = 0),
    CHECK (partition >= 0 AND partition < partitions)
);

CREATE FUNCTION idem_partition.configure(partition integer, partitions integer,
                                         accepting boolean DEFAULT true, resharding text DEFAULT NULL)
RETURNS idem_partition.config LANGUAGE sql AS $$
    INSERT INTO idem_partition.config AS c (partition, partitions, accepting, resharding)
    VALUES (configure.partition, configure.partitions, configure.accepting, configure.resharding)
    ON CONFLICT (singleton) DO UPDATE
        SET partition = excluded.partition, partitions = excluded.partitions,
            accepting = excluded.accepting, resharding = excluded.resharding
    RETURNING c.*
$$;

-- Raises IK900 unless this partition owns the scope now. A NULL scope passes: the extension's
-- function reports it (22004), as it would without a proxy.
CREATE FUNCTION idem_partition.check_owner(scope text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c idem_partition.config;
    owner integer;
BEGIN
    IF scope IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO c FROM idem_partition.config;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this database is not configured as an idempotency partition'
            USING ERRCODE = 'IK900',
                  HINT = 'Run SELECT idem_partition.configure(partition, partitions) (scale-out/idem_scaleout.py partition-config prints it).';
    END IF;
    owner := idem_partition.idem_scope_partition(scope, c.partitions);
    IF owner <> c.partition THEN
        RAISE EXCEPTION 'scope "%" belongs to partition % of %, not to partition %',
                        scope, owner, c.partitions, c.partition
            USING ERRCODE = 'IK900',
                  HINT = 'The keys were resharded or the caller routes with an old configuration; retry through the proxy, or connect to the partition idem_partition_of() names.';
    END IF;
    IF NOT c.accepting THEN
        RAISE EXCEPTION 'partition % of % is not accepting calls yet', c.partition, c.partitions
            USING ERRCODE = 'IK900',
                  HINT = 'Its keys are being copied in by a resharding; retry shortly.';
    END IF;
END
$$;

-- The wrappers. Writers take idem_keys' ROW EXCLUSIVE lock (the lock the extension's write takes
-- anyway) before reading the configuration: a resharding holds EXCLUSIVE on idem_keys while it
-- moves keys and changes the configuration, so a writer either finishes before the move or sees
-- the new owner. A lookup reads first and checks after: if the scope is still owned at the check,
-- the lookup's earlier snapshot saw the keys before any move.
DO $do$
DECLARE
    s text := (SELECT quote_ident(n.nspname) FROM pg_extension e
               JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'idempotency');
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'extension "idempotency" is not installed in this database'
            USING ERRCODE = '55000', HINT = 'Run CREATE EXTENSION idempotency first.';
    END IF;
    EXECUTE format($f$
CREATE FUNCTION idem_partition.idem_claim(key text, request jsonb DEFAULT NULL, scope text DEFAULT '',
                                          ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                                          fingerprint bytea DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS %1$s.idem_claim_result LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_claim(key, request, scope, ttl, lease, fingerprint, wait);
END
$$;

CREATE FUNCTION idem_partition.idem_complete(key text, response jsonb, response_code integer DEFAULT 200,
                                             scope text DEFAULT '', attempt integer DEFAULT NULL,
                                             ttl interval DEFAULT NULL, body bytea DEFAULT NULL,
                                             headers jsonb DEFAULT NULL)
RETURNS %1$s.idem_keys LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_complete(key, response, response_code, scope, attempt, ttl, body, headers);
END
$$;

CREATE FUNCTION idem_partition.idem_fail(key text, response jsonb DEFAULT NULL,
                                         response_code integer DEFAULT 500, retryable boolean DEFAULT true,
                                         scope text DEFAULT '', attempt integer DEFAULT NULL,
                                         ttl interval DEFAULT NULL, body bytea DEFAULT NULL,
                                         headers jsonb DEFAULT NULL)
RETURNS %1$s.idem_keys LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_fail(key, response, response_code, retryable, scope, attempt, ttl, body, headers);
END
$$;

CREATE FUNCTION idem_partition.idem_extend(key text, attempt integer, lease interval, scope text DEFAULT '')
RETURNS %1$s.idem_keys LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_extend(key, attempt, lease, scope);
END
$$;

CREATE FUNCTION idem_partition.idem_release(key text, attempt integer, scope text DEFAULT '')
RETURNS %1$s.idem_keys LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_release(key, attempt, scope);
END
$$;

CREATE FUNCTION idem_partition.idem_forget(key text, scope text DEFAULT '', force boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_forget(key, scope, force);
END
$$;

-- The batch calls (extension 1.3; idem_claim_batch's applied, 1.4): one scope per call, so one partition.
CREATE FUNCTION idem_partition.idem_claim_batch(keys text[], scope text DEFAULT '',
                                                requests jsonb[] DEFAULT NULL, fingerprints bytea[] DEFAULT NULL,
                                                ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                                                wait interval DEFAULT NULL, applied boolean DEFAULT false)
RETURNS TABLE (key text, outcome %1$s.idem_outcome, inserted boolean, attempt integer,
               state %1$s.idem_state, response jsonb, response_code integer, retry_after_s integer,
               expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    -- applied needs extension 1.4; without it, the call works with 1.3 too
    IF applied THEN
        RETURN QUERY SELECT * FROM %1$s.idem_claim_batch(keys, scope, requests, fingerprints, ttl, lease, wait,
                                                          applied => true);
    ELSE
        RETURN QUERY SELECT * FROM %1$s.idem_claim_batch(keys, scope, requests, fingerprints, ttl, lease, wait);
    END IF;
END
$$;

CREATE FUNCTION idem_partition.idem_complete_batch(keys text[], scope text DEFAULT '',
                                                   attempts integer[] DEFAULT NULL, responses jsonb[] DEFAULT NULL,
                                                   response_code integer DEFAULT 200, ttl interval DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE %1$s.idem_keys IN ROW EXCLUSIVE MODE;
    PERFORM idem_partition.check_owner(scope);
    RETURN %1$s.idem_complete_batch(keys, scope, attempts, responses, response_code, ttl);
END
$$;

CREATE FUNCTION idem_partition.idem_lookup(key text, scope text DEFAULT '')
RETURNS %1$s.idem_keys LANGUAGE plpgsql AS $$
DECLARE
    found_row %1$s.idem_keys := %1$s.idem_lookup(key, scope);
BEGIN
    PERFORM idem_partition.check_owner(scope);
    RETURN found_row;
END
$$;

-- This partition's stalled keys (pending, lease ended), for a reconciliation job through the proxy.
CREATE FUNCTION idem_partition.stalled(OUT scope text, OUT key text, OUT attempt integer,
                                       OUT locked_until timestamptz, OUT created_at timestamptz,
                                       OUT stalled_for interval)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT scope, key, attempt, locked_until, created_at, stalled_for FROM %1$s.idem_stalled
$$;

-- One row for monitoring through the proxy (idem_partition_stats()): which partition answers, and its counters.
CREATE FUNCTION idem_partition.stats(OUT partition integer, OUT partitions integer, OUT accepting boolean,
                                     OUT claims bigint, OUT inserted bigint, OUT replays bigint,
                                     OUT in_progress bigint, OUT takeovers bigint, OUT mismatches bigint,
                                     OUT completes bigint, OUT fails bigint, OUT reaped bigint,
                                     OUT last_reap_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT c.partition, c.partitions, c.accepting, s.claims, s.inserted, s.replays, s.in_progress,
           s.takeovers, s.mismatches, s.completes, s.fails, s.reaped, s.last_reap_at
    FROM idem_partition.config c, %1$s.idem_stats s
$$;
$f$, s);
END
$do$;

-- Callers need USAGE on the schema and SELECT on the configuration besides the extension's own
-- grants on idem_keys (docs/scale-out.md, "Roles").
GRANT USAGE ON SCHEMA idem_partition TO PUBLIC;
GRANT SELECT ON idem_partition.config TO PUBLIC;
-- changing which scopes this partition owns is the operator's (and the resharding tool's)
REVOKE EXECUTE ON FUNCTION idem_partition.configure(integer, integer, boolean, text) FROM PUBLIC;
