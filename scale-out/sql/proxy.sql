-- Proxy side of the scale-out setup: run once in the proxy's database (without the idempotency
-- extension: these functions take its names). Needs PL/Proxy (postgresql-15-plproxy). The
-- cluster itself (server "idempotency", one option p0, p1, ... per partition) comes from
-- scale-out/idem_scaleout.py proxy-config.
--
-- For version 1.2 of the extension on the partitions. Every function has the extension's
-- signature and result type and runs, with PL/Proxy, the
-- function of the same name in schema idem_partition on the partition that owns the scope.
-- Each call is its own transaction on that partition: same-transaction mode needs a direct
-- connection (idem_partition_of()).
\set ON_ERROR_STOP on

CREATE EXTENSION IF NOT EXISTS plproxy;

CREATE TYPE idem_state AS ENUM ('pending', 'succeeded', 'failed');
CREATE TYPE idem_outcome AS ENUM ('claimed', 'replay', 'in_progress');
CREATE TYPE idem_claim_result AS (
    outcome       idem_outcome,
    inserted      boolean,
    attempt       integer,
    state         idem_state,
    response      jsonb,
    response_code integer,
    retry_after   interval,
    expires_at    timestamptz,
    retry_after_s    integer,
    response_body    bytea,
    response_headers jsonb
);
-- The row type of the partitions' idem_keys (results of complete, fail and lookup).
CREATE TYPE idem_keys AS (
    scope         text,
    key           text,
    state         idem_state,
    attempt       integer,
    fingerprint   bytea,
    response      jsonb,
    response_code integer,
    retryable     boolean,
    created_at    timestamptz,
    locked_until  timestamptz,
    completed_at  timestamptz,
    expires_at    timestamptz,
    response_body    bytea,
    response_headers jsonb,
    claimed_at       timestamptz
);

CREATE SCHEMA idem_partition;

-- The routing rule, identical to the partitions' (scale-out/sql/partition.sql).
CREATE FUNCTION idem_partition.idem_scope_hash(scope text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ('x' || left(encode(sha256(textsend(scope)), 'hex'), 8))::bit(32)::integer;

CREATE FUNCTION idem_partition.idem_scope_partition(scope text, partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN idem_partition.idem_scope_hash(scope) & (partitions - 1);

-- PL/Proxy's RUN ON: a NULL scope goes to partition 0, whose idem_* function reports it (22004)
-- exactly as the extension does.
CREATE FUNCTION idem_partition.route(scope text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(idem_partition.idem_scope_hash(scope), 0);

CREATE FUNCTION idem_claim(key text, request jsonb DEFAULT NULL, scope text DEFAULT '',
                           ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                           fingerprint bytea DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS idem_claim_result LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_claim;
$$;

CREATE FUNCTION idem_complete(key text, response jsonb, response_code integer DEFAULT 200,
                              scope text DEFAULT '', attempt integer DEFAULT NULL,
                              ttl interval DEFAULT NULL, body bytea DEFAULT NULL,
                              headers jsonb DEFAULT NULL)
RETURNS idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_complete;
$$;

CREATE FUNCTION idem_fail(key text, response jsonb DEFAULT NULL, response_code integer DEFAULT 500,
                          retryable boolean DEFAULT true, scope text DEFAULT '',
                          attempt integer DEFAULT NULL, ttl interval DEFAULT NULL,
                          body bytea DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_fail;
$$;

CREATE FUNCTION idem_extend(key text, attempt integer, lease interval, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_extend;
$$;

CREATE FUNCTION idem_release(key text, attempt integer, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_release;
$$;

CREATE FUNCTION idem_forget(key text, scope text DEFAULT '', force boolean DEFAULT false)
RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_forget;
$$;

-- Extension 1.3's batch calls (applied: 1.4): a batch has one scope, so one partition runs it whole.
-- Each proxied call commits on its own there, so applied => true records the ids as applied at once.
CREATE FUNCTION idem_claim_batch(keys text[], scope text DEFAULT '', requests jsonb[] DEFAULT NULL,
                                 fingerprints bytea[] DEFAULT NULL, ttl interval DEFAULT NULL,
                                 lease interval DEFAULT NULL, wait interval DEFAULT NULL,
                                 applied boolean DEFAULT false)
RETURNS TABLE (key text, outcome idem_outcome, inserted boolean, attempt integer, state idem_state,
               response jsonb, response_code integer, retry_after_s integer, expires_at timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_claim_batch;
$$;

CREATE FUNCTION idem_complete_batch(keys text[], scope text DEFAULT '', attempts integer[] DEFAULT NULL,
                                    responses jsonb[] DEFAULT NULL, response_code integer DEFAULT 200,
                                    ttl interval DEFAULT NULL)
RETURNS bigint LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_complete_batch;
$$;

CREATE FUNCTION idem_lookup(key text, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_lookup;
$$;

-- Which partition holds a scope, for applications that connect to it directly (same-transaction
-- mode). connstr is the proxy's connection string for it: passwords belong in the user mapping,
-- never in the server's options, which every role can read.
CREATE FUNCTION idem_partition_of(scope text, OUT partition integer, OUT partitions integer,
                                  OUT connstr text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    options text[] := (SELECT srvoptions FROM pg_foreign_server WHERE srvname = 'idempotency');
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'argument "scope" must not be null' USING ERRCODE = '22004';
    END IF;
    IF options IS NULL THEN
        RAISE EXCEPTION 'cluster "idempotency" is not configured'
            USING ERRCODE = '55000', HINT = 'Run the SQL that scale-out/generate prints.';
    END IF;
    partitions := (SELECT count(*) FROM unnest(options) o WHERE o ~ '^p[0-9]+=');
    partition := idem_partition.idem_scope_partition(scope, partitions);
    connstr := (SELECT substr(o, length('p' || partition) + 2) FROM unnest(options) o
                WHERE o LIKE 'p' || partition || '=%');
END
$$;

-- Every partition's stalled keys (the extension's idem_stalled view), oldest first within each
-- partition: what a reconciliation job walks, finishing each key through the proxy.
CREATE FUNCTION idem_stalled(OUT scope text, OUT key text, OUT attempt integer,
                             OUT locked_until timestamptz, OUT created_at timestamptz,
                             OUT stalled_for interval)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    TARGET idem_partition.stalled;
$$;

-- Monitoring: one row per partition, each from the partition itself.
CREATE FUNCTION idem_partition_stats(OUT partition integer, OUT partitions integer, OUT accepting boolean,
                                     OUT claims bigint, OUT inserted bigint, OUT replays bigint,
                                     OUT in_progress bigint, OUT takeovers bigint, OUT mismatches bigint,
                                     OUT completes bigint, OUT fails bigint, OUT reaped bigint,
                                     OUT last_reap_at timestamptz)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON ALL;
    TARGET idem_partition.stats;
$$;
