-- Proxy side of the scale-out setup: run once in the proxy's database (without the idempotency
-- extension: these functions take its names). Needs PL/Proxy (postgresql-15-plproxy). The
-- cluster itself (server "idempotency", one option p0, p1, ... per partition) comes from
-- scale-out/idem_scaleout.py proxy-config.
--
-- For version 1.2 of the extension on the partitions. Every public function has the extension's
-- signature and result type and runs, with PL/Proxy, the function of the same name in schema
-- idem_partition on the partition that owns the scope. The PL/Proxy functions themselves are in
-- schema idem_remote; the public ones wrap them so that a partition that cannot be reached
-- answers IK901 (idempotency_partition_unavailable) instead of PL/Proxy's XX000.
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
CREATE SCHEMA idem_remote;
-- PL/Proxy evaluates RUN ON as the caller, and the wrappers call idem_remote as the caller
GRANT USAGE ON SCHEMA idem_partition, idem_remote TO PUBLIC;

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

-- How many partitions this proxy routes to (the server's options p0, p1, ...).
CREATE FUNCTION idem_partition.partition_count() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM pg_foreign_server s, unnest(s.srvoptions) o
    WHERE s.srvname = 'idempotency' AND o ~ '^p[0-9]+='
$$;

-- Why PL/Proxy could not get an answer from a partition, or NULL when the error is the
-- partition's own answer (IK001, 22004, ... keep their SQLSTATE) or a PL/Proxy bug (XX000).
-- PL/Proxy reports a connection that fails or breaks as XX000 with the failing libpq call in the
-- message, and passes on a partition's shutdown as its 57P0x. The reason never quotes a
-- connection string (PL/Proxy's "connect timeout to: <connstr>" does): libpq's own text only.
CREATE FUNCTION idem_remote.unreachable_reason(state text, message text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN state LIKE '08%' OR state IN ('57P01', '57P02', '57P03')
            THEN 'the partition is shutting down, restarting or refusing connections (SQLSTATE ' || state || ')'
        WHEN state <> 'XX000' THEN NULL
        WHEN message ~ '^PL/Proxy function \S+: connect timeout to: '
            THEN 'the connection attempt timed out (PL/Proxy connect_timeout)'
        WHEN message ~ '^PL/Proxy function \S+: query timeout'
            THEN 'the call timed out (PL/Proxy query_timeout)'
        WHEN message ~ '^PL/Proxy function \S+: \[[^]]*\] (PQconnectStart|PQconnectPoll|PQsendQuery|PQsendQueryParams|PQflush|PQconsumeInput): '
            THEN btrim(regexp_replace(message, '^PL/Proxy function \S+: \[[^]]*\] ', ''), E' \n')
        WHEN message ~ '^\S+: \[[^]]*\] REMOTE \S+: (server closed the connection|could not receive data|could not send data|no connection to the server|SSL SYSCALL error|lost synchronization)'
            THEN btrim(regexp_replace(message, '^\S+: \[[^]]*\] REMOTE \S+: ', ''), E' \n')
    END
$$;

-- Raises IK901 for the partition that `hash` routes to when the error (state, message) says it
-- could not be reached; returns otherwise, and the caller re-raises the original error.
CREATE FUNCTION idem_remote.raise_if_unreachable(hash integer, state text, message text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    reason text := idem_remote.unreachable_reason(state, message);
    partitions integer;
BEGIN
    IF reason IS NULL THEN
        RETURN;
    END IF;
    partitions := idem_partition.partition_count();
    RAISE EXCEPTION 'partition % of % is unavailable', hash & (partitions - 1), partitions
        USING ERRCODE = 'IK901', DETAIL = reason,
              HINT = 'Retry later; the call may or may not have taken effect there, as after a broken connection. Scopes on other partitions are not affected.';
END
$$;

-- The PL/Proxy calls, one per function: CLUSTER, RUN ON the scope's hash, the partition's checked
-- function of the same name.
CREATE FUNCTION idem_remote.idem_claim(key text, request jsonb DEFAULT NULL, scope text DEFAULT '',
                                       ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                                       fingerprint bytea DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS public.idem_claim_result LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_claim;
$$;

CREATE FUNCTION idem_remote.idem_complete(key text, response jsonb, response_code integer DEFAULT 200,
                                          scope text DEFAULT '', attempt integer DEFAULT NULL,
                                          ttl interval DEFAULT NULL, body bytea DEFAULT NULL,
                                          headers jsonb DEFAULT NULL)
RETURNS public.idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_complete;
$$;

CREATE FUNCTION idem_remote.idem_fail(key text, response jsonb DEFAULT NULL, response_code integer DEFAULT 500,
                                      retryable boolean DEFAULT true, scope text DEFAULT '',
                                      attempt integer DEFAULT NULL, ttl interval DEFAULT NULL,
                                      body bytea DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS public.idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_fail;
$$;

CREATE FUNCTION idem_remote.idem_extend(key text, attempt integer, lease interval, scope text DEFAULT '')
RETURNS public.idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_extend;
$$;

CREATE FUNCTION idem_remote.idem_release(key text, attempt integer, scope text DEFAULT '')
RETURNS public.idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_release;
$$;

CREATE FUNCTION idem_remote.idem_forget(key text, scope text DEFAULT '', force boolean DEFAULT false)
RETURNS boolean LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_forget;
$$;

CREATE FUNCTION idem_remote.idem_claim_batch(keys text[], scope text DEFAULT '', requests jsonb[] DEFAULT NULL,
                                             fingerprints bytea[] DEFAULT NULL, ttl interval DEFAULT NULL,
                                             lease interval DEFAULT NULL, wait interval DEFAULT NULL,
                                             applied boolean DEFAULT false)
RETURNS TABLE (key text, outcome public.idem_outcome, inserted boolean, attempt integer, state public.idem_state,
               response jsonb, response_code integer, retry_after_s integer, expires_at timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_claim_batch;
$$;

CREATE FUNCTION idem_remote.idem_complete_batch(keys text[], scope text DEFAULT '', attempts integer[] DEFAULT NULL,
                                                responses jsonb[] DEFAULT NULL, response_code integer DEFAULT 200,
                                                ttl interval DEFAULT NULL)
RETURNS bigint LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_complete_batch;
$$;

CREATE FUNCTION idem_remote.idem_lookup(key text, scope text DEFAULT '')
RETURNS public.idem_keys LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.route(scope);
    TARGET idem_partition.idem_lookup;
$$;


-- The public functions: the extension's signatures, each the PL/Proxy call of the same name in
-- idem_remote, with a partition that cannot be reached answering IK901 (docs/errors.md). Every
-- other error comes through unchanged (RAISE re-raises it whole: SQLSTATE, detail, hint).
CREATE FUNCTION idem_claim(key text, request jsonb DEFAULT NULL, scope text DEFAULT '',
                           ttl interval DEFAULT NULL, lease interval DEFAULT NULL,
                           fingerprint bytea DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS idem_claim_result LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_claim(key, request, scope, ttl, lease, fingerprint, wait);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_complete(key text, response jsonb, response_code integer DEFAULT 200,
                              scope text DEFAULT '', attempt integer DEFAULT NULL,
                              ttl interval DEFAULT NULL, body bytea DEFAULT NULL,
                              headers jsonb DEFAULT NULL)
RETURNS idem_keys LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_complete(key, response, response_code, scope, attempt, ttl, body, headers);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_fail(key text, response jsonb DEFAULT NULL, response_code integer DEFAULT 500,
                          retryable boolean DEFAULT true, scope text DEFAULT '',
                          attempt integer DEFAULT NULL, ttl interval DEFAULT NULL,
                          body bytea DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS idem_keys LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_fail(key, response, response_code, retryable, scope, attempt, ttl, body, headers);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_extend(key text, attempt integer, lease interval, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_extend(key, attempt, lease, scope);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_release(key text, attempt integer, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_release(key, attempt, scope);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_forget(key text, scope text DEFAULT '', force boolean DEFAULT false)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_forget(key, scope, force);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

-- Extension 1.3's batch calls (applied: 1.4): a batch has one scope, so one partition runs it whole.
-- Each proxied call commits on its own there, so applied => true records the ids as applied at once.
CREATE FUNCTION idem_claim_batch(keys text[], scope text DEFAULT '', requests jsonb[] DEFAULT NULL,
                                 fingerprints bytea[] DEFAULT NULL, ttl interval DEFAULT NULL,
                                 lease interval DEFAULT NULL, wait interval DEFAULT NULL,
                                 applied boolean DEFAULT false)
RETURNS TABLE (key text, outcome idem_outcome, inserted boolean, attempt integer, state idem_state,
               response jsonb, response_code integer, retry_after_s integer, expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM idem_remote.idem_claim_batch(keys, scope, requests, fingerprints, ttl, lease,
                                                            wait, applied);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_complete_batch(keys text[], scope text DEFAULT '', attempts integer[] DEFAULT NULL,
                                    responses jsonb[] DEFAULT NULL, response_code integer DEFAULT 200,
                                    ttl interval DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_complete_batch(keys, scope, attempts, responses, response_code, ttl);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
$$;

CREATE FUNCTION idem_lookup(key text, scope text DEFAULT '')
RETURNS idem_keys LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_remote.idem_lookup(key, scope);
EXCEPTION WHEN OTHERS THEN
    PERFORM idem_remote.raise_if_unreachable(idem_partition.route(scope), SQLSTATE, SQLERRM);
    RAISE;
END
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
            USING ERRCODE = '55000', HINT = 'Run the SQL that scale-out/idem_scaleout.py proxy-config prints.';
    END IF;
    partitions := (SELECT count(*) FROM unnest(options) o WHERE o ~ '^p[0-9]+=');
    partition := idem_partition.idem_scope_partition(scope, partitions);
    connstr := (SELECT substr(o, length('p' || partition) + 2) FROM unnest(options) o
                WHERE o LIKE 'p' || partition || '=%');
END
$$;

-- The cluster-wide calls ask one partition at a time (PL/Proxy's RUN ON ALL fails whole when
-- one partition cannot be reached): RUN ON the partition's number as the hash, which PL/Proxy
-- masks with (partitions - 1).
CREATE FUNCTION idem_partition.nth(target integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN target;

CREATE FUNCTION idem_remote.stalled_on(target integer, OUT scope text, OUT key text, OUT attempt integer,
                                       OUT locked_until timestamptz, OUT created_at timestamptz,
                                       OUT stalled_for interval)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.nth(target);
    SELECT scope, key, attempt, locked_until, created_at, stalled_for FROM idem_partition.stalled();
$$;

CREATE FUNCTION idem_remote.stats_on(target integer, OUT partition integer, OUT partitions integer,
                                     OUT accepting boolean, OUT claims bigint, OUT inserted bigint,
                                     OUT replays bigint, OUT in_progress bigint, OUT takeovers bigint,
                                     OUT mismatches bigint, OUT completes bigint, OUT fails bigint,
                                     OUT reaped bigint, OUT last_reap_at timestamptz)
RETURNS SETOF record LANGUAGE plproxy AS $$
    CLUSTER 'idempotency';
    RUN ON idem_partition.nth(target);
    SELECT partition, partitions, accepting, claims, inserted, replays, in_progress, takeovers,
           mismatches, completes, fails, reaped, last_reap_at FROM idem_partition.stats();
$$;

-- Every partition's stalled keys (the extension's idem_stalled view), oldest first within each
-- partition: what a reconciliation job walks, finishing each key through the proxy. A partition
-- that cannot be reached adds a WARNING (SQLSTATE IK901) naming it instead of failing the call.
CREATE FUNCTION idem_stalled(OUT scope text, OUT key text, OUT attempt integer,
                             OUT locked_until timestamptz, OUT created_at timestamptz,
                             OUT stalled_for interval)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    partitions integer := idem_partition.partition_count();
    reason text;
BEGIN
    FOR p IN 0 .. partitions - 1 LOOP
        BEGIN
            RETURN QUERY SELECT * FROM idem_remote.stalled_on(p);
        EXCEPTION WHEN OTHERS THEN
            reason := idem_remote.unreachable_reason(SQLSTATE, SQLERRM);
            IF reason IS NULL THEN
                RAISE;
            END IF;
            RAISE WARNING 'partition % of % is unavailable: its stalled keys are not listed', p, partitions
                USING ERRCODE = 'IK901', DETAIL = reason;
        END;
    END LOOP;
END
$$;

-- Monitoring: one row per partition, each from the partition itself; a partition that cannot be
-- reached gets a row with available = false, its number and the proxy's count, NULL otherwise.
CREATE FUNCTION idem_partition_stats(OUT partition integer, OUT partitions integer, OUT accepting boolean,
                                     OUT claims bigint, OUT inserted bigint, OUT replays bigint,
                                     OUT in_progress bigint, OUT takeovers bigint, OUT mismatches bigint,
                                     OUT completes bigint, OUT fails bigint, OUT reaped bigint,
                                     OUT last_reap_at timestamptz, OUT available boolean)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    n integer := idem_partition.partition_count();
BEGIN
    FOR p IN 0 .. n - 1 LOOP
        BEGIN
            RETURN QUERY SELECT *, true FROM idem_remote.stats_on(p);
        EXCEPTION WHEN OTHERS THEN
            IF idem_remote.unreachable_reason(SQLSTATE, SQLERRM) IS NULL THEN
                RAISE;
            END IF;
            RETURN QUERY SELECT p, n, NULL::boolean, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                                NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                                NULL::timestamptz, false;
        END;
    END LOOP;
END
$$;
