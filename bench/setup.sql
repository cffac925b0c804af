-- Helpers for bench/run, loaded into every benchmark database after CREATE EXTENSION idempotency
-- and bench/references.sql. Schema "bench": the request and response bodies, data loaders and
-- the memory probe. Nothing here is measured except through the workloads that call it.

CREATE SCHEMA bench;

-- The bodies the workloads use: ~60-byte JSON (as jsonb text: 66 and 64 bytes).
CREATE FUNCTION bench.req() RETURNS jsonb IMMUTABLE LANGUAGE sql
    RETURN '{"amount": 4200, "currency": "EUR", "customer": "cus_0000004217"}'::jsonb;
CREATE FUNCTION bench.resp() RETURNS jsonb IMMUTABLE LANGUAGE sql
    RETURN '{"id": "pay_0000004217", "amount": 4200, "status": "succeeded"}'::jsonb;

-- Bodies of the same size that differ per key (bytes per key: no two keys share a fingerprint).
CREATE FUNCTION bench.req(i bigint) RETURNS jsonb IMMUTABLE LANGUAGE sql
    RETURN jsonb_build_object('amount', 1000 + i % 9000, 'currency', 'EUR',
                              'customer', 'cus_' || lpad(i::text, 10, '0'));
CREATE FUNCTION bench.resp(i bigint) RETURNS jsonb IMMUTABLE LANGUAGE sql
    RETURN jsonb_build_object('id', 'pay_' || lpad(i::text, 10, '0'), 'amount', 1000 + i % 9000,
                              'status', 'succeeded');

-- The key of number i: a UUID-shaped text, as the replay workloads compute it.
CREATE FUNCTION bench.key(i bigint) RETURNS text IMMUTABLE LANGUAGE sql
    RETURN md5(i::text)::uuid::text;

-- Replay: n completed keys (claimed, then completed, request bench.req(), response bench.resp()),
-- in idem_keys through the extension and in ref.keys_a through reference (a).
CREATE PROCEDURE bench.load_replay(n integer)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM idem_claim(bench.key(i), bench.req(), 'POST /payments') FROM generate_series(1, n) i;
    COMMIT;
    PERFORM idem_complete(bench.key(i), bench.resp(), 201, 'POST /payments')
       FROM generate_series(1, n) i;
    COMMIT;
    PERFORM ref.claim_a(bench.key(i), bench.req(), 'POST /payments') FROM generate_series(1, n) i;
    COMMIT;
    PERFORM ref.complete_a(bench.key(i), bench.resp(), 201, 'POST /payments')
       FROM generate_series(1, n) i;
    COMMIT;
END
$$;

-- Bytes per key: n keys, each claimed and completed in its own transaction as an application
-- would (UUID-shaped keys, ~60-byte requests and responses, different per key): in idem_keys
-- through the extension (which = 'extension'), or in ref.keys_a through reference (a).
CREATE PROCEDURE bench.load_size(which text, n integer)
LANGUAGE plpgsql
AS $$
DECLARE
    k text;
BEGIN
    FOR i IN 1..n LOOP
        k := md5('size-' || i)::uuid::text;
        IF which = 'extension' THEN
            PERFORM idem_claim(k, bench.req(i), 'POST /payments');
            PERFORM idem_complete(k, bench.resp(i), 201, 'POST /payments');
        ELSE
            PERFORM ref.claim_a(k, bench.req(i), 'POST /payments');
            PERFORM ref.complete_a(k, bench.resp(i), 201, 'POST /payments');
        END IF;
        COMMIT;
    END LOOP;
END
$$;

-- Reaping: the same n expired keys (succeeded, failed, and pending with an expired lease) for
-- idem_keys and ref.keys_reap, staged once.
CREATE TABLE bench.reap_src AS
    SELECT * FROM ref.keys_a WITH NO DATA;

CREATE PROCEDURE bench.stage_reap(n integer)
LANGUAGE plpgsql
AS $$
BEGIN
    TRUNCATE bench.reap_src;
    INSERT INTO bench.reap_src
    SELECT 'POST /payments', md5('reap-' || i)::uuid::text,
           CASE WHEN i % 20 = 0 THEN 'failed' WHEN i % 50 = 1 THEN 'pending' ELSE 'succeeded' END,
           1, sha256(convert_to('POST /payments', 'UTF8') || '\x00'::bytea
                     || convert_to(bench.req(i)::text, 'UTF8')),
           CASE WHEN i % 50 = 1 THEN NULL ELSE bench.resp(i) END,
           CASE WHEN i % 20 = 0 THEN 502 WHEN i % 50 = 1 THEN NULL ELSE 201 END,
           CASE WHEN i % 20 = 0 THEN true END,
           now() - interval '2 days' - (i % 3600) * interval '1 second',
           CASE WHEN i % 50 = 1 THEN now() - interval '2 days' END,
           CASE WHEN i % 50 = 1 THEN NULL ELSE now() - interval '2 days' END,
           now() - interval '1 day' - (i % 3600) * interval '1 second'
      FROM generate_series(1, n) i;
END
$$;

CREATE PROCEDURE bench.load_reap()
LANGUAGE plpgsql
AS $$
BEGIN
    TRUNCATE idem_keys, ref.keys_reap;
    INSERT INTO idem_keys
    SELECT scope, key, state::idem_state, attempt, fingerprint, response, response_code,
           retryable, created_at, locked_until, completed_at, expires_at
      FROM bench.reap_src;
    INSERT INTO ref.keys_reap SELECT * FROM bench.reap_src;
END
$$;

-- Memory: what this backend holds, recorded by the memory workload.
CREATE TABLE bench.mem_probe (
    label         text,
    pid           integer,
    context_bytes bigint,       -- sum(total_bytes) of pg_backend_memory_contexts
    rss_anon_kb   bigint,       -- RssAnon of /proc/self/status: private memory, palloc or not
    at            timestamptz DEFAULT clock_timestamp()
);

CREATE FUNCTION bench.probe(label text) RETURNS void
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO bench.mem_probe (label, pid, context_bytes, rss_anon_kb)
    SELECT label, pg_backend_pid(),
           (SELECT sum(total_bytes) FROM pg_backend_memory_contexts),
           (regexp_match(pg_read_file('/proc/self/status'), 'RssAnon:\s+(\d+)'))[1]::bigint;
END;

-- Wait-event sampling: every 50 ms for the given seconds, what the other active client backends
-- of this database are doing (wait_event_type:wait_event, or CPU when they wait for nothing),
-- returned as the average number of backends per event over the samples. Kept in a variable, not
-- a table: the sampler must write no WAL into the run it watches.
CREATE FUNCTION bench.sample_waits(seconds numeric)
RETURNS TABLE (event text, backends numeric)
LANGUAGE plpgsql
AS $$
DECLARE
    samples integer := 0;
    seen    text[] := '{}';
    stop_at timestamptz := clock_timestamp() + seconds * interval '1 second';
BEGIN
    WHILE clock_timestamp() < stop_at LOOP
        -- pg_stat_activity is read once per transaction unless told to read it again
        PERFORM pg_stat_clear_snapshot();
        seen := seen || ARRAY(
            SELECT coalesce(a.wait_event_type || ':' || a.wait_event, 'CPU')
              FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.backend_type = 'client backend'
               AND a.state = 'active' AND a.pid <> pg_backend_pid());
        samples := samples + 1;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN QUERY SELECT e, round(count(*)::numeric / samples, 2)
                   FROM unnest(seen) e GROUP BY e ORDER BY 2 DESC, 1;
END
$$;
