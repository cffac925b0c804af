-- Hand-written references for the benchmark suite (bench/run): what a careful application would
-- write itself instead of using the extension. Written for this project; loaded by bench/run into
-- every benchmark database, next to CREATE EXTENSION idempotency.
--
-- Every reference table has the columns of idem_keys (docs/contract.md §1) and a design a careful author would
-- choose: text primary key (scope, key) in the "C" collation (keys are ASCII; byte order makes the
-- comparisons memcmp, as idem_keys does), state as text with a CHECK, the fingerprint as bytea
-- (SHA-256 via PostgreSQL 15's built-in sha256(), no pgcrypto). Indexes and storage parameters are
-- idem_keys' own, copied from it below: the same primary key, the same BRIN on expires_at with the
-- same options, the same autovacuum settings, so that a ratio compares the code, not the indexes.
--
-- The functions compute what the extension computes (same fingerprint, same states, same clock:
-- clock_timestamp()). They do NOT validate keys and scopes (length, printable ASCII), which the
-- extension does on every call: that only makes the references faster.
--
--   (a) ref.claim_a / ref.complete_a: the PL/pgSQL state machine as articles teach it:
--       INSERT ... ON CONFLICT DO NOTHING RETURNING; if no row: SELECT ... FOR UPDATE, fingerprint
--       check, then replay / in_progress / takeover (UPDATE). complete: UPDATE ... WHERE
--       state = 'pending' RETURNING, raise if no row.
--   (b) ref.claim_b: one INSERT ... ON CONFLICT (scope, key) DO UPDATE ... WHERE <takeover>
--       RETURNING xmax = 0; when it returns nothing, a SELECT tells replay from in_progress.
--   (c) raw prepared statements, no functions: in the pgbench scripts (bench/workloads/*_c.sql).
--   (d) physical limits: a plain INSERT of the same row into ref.keys_plain, a copy of idem_keys
--       (columns, types, indexes, storage parameters: bench/workloads/claim_insert.sql), and a
--       plain primary-key SELECT of the same row of idem_keys itself
--       (bench/workloads/replay_select.sql).
--   ref.claim_a_checked: (a) plus the contract's argument and privilege checks of a claim.
--   ref.claim_batch_a / ref.complete_batch_a: (a) for batches, set-based (below (a)).
--   ref.reap_all: the hand-written batched DELETE ... USING (SELECT ctid ... FOR UPDATE SKIP
--       LOCKED) loop, committing after each batch, to compare with CALL idem_reap_all().

CREATE SCHEMA ref;

-- The result of a claim: the same fields as idem_claim_result (outcome and state as text).
CREATE TYPE ref.claim_result AS (
    outcome       text,      -- 'claimed', 'replay', 'in_progress'
    inserted      boolean,
    attempt       integer,
    state         text,
    response      jsonb,
    response_code integer,
    retry_after   interval,
    expires_at    timestamptz
);

CREATE TABLE ref.keys_a (
    scope         text COLLATE "C" NOT NULL DEFAULT '',
    key           text COLLATE "C" NOT NULL,
    state         text NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed')),
    attempt       integer NOT NULL,
    fingerprint   bytea,
    response      jsonb,
    response_code integer,
    retryable     boolean,
    created_at    timestamptz NOT NULL,
    locked_until  timestamptz,
    completed_at  timestamptz,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- The same design, one table per use, so that workloads never share rows:
--   keys_b     reference (b)
--   keys_c     reference (c), raw prepared statements
--   keys_reap  the hand-written reaper
-- and the limit's table, idem_keys' own shape:
--   keys_plain reference (d), plain INSERT
CREATE TABLE ref.keys_b     (LIKE ref.keys_a INCLUDING ALL);
CREATE TABLE ref.keys_c     (LIKE ref.keys_a INCLUDING ALL);
CREATE TABLE ref.keys_reap  (LIKE ref.keys_a INCLUDING ALL);
CREATE TABLE ref.keys_plain (LIKE idem_keys INCLUDING ALL);

-- idem_keys' storage parameters on every table, and its index on expires_at (access method and
-- options, whatever the installed version has) on those that do not copy it.
DO $$
DECLARE
    table_options text := (SELECT array_to_string(reloptions, ', ') FROM pg_class
                            WHERE oid = 'idem_keys'::regclass);
    expiry_index  text := (SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
                            WHERE i.indrelid = 'idem_keys'::regclass AND NOT i.indisprimary);
    t             text;
BEGIN
    FOREACH t IN ARRAY ARRAY['keys_a', 'keys_b', 'keys_c', 'keys_reap', 'keys_plain'] LOOP
        IF table_options IS NOT NULL THEN
            EXECUTE format('ALTER TABLE ref.%I SET (%s)', t, table_options);
        END IF;
        IF t <> 'keys_plain' THEN
            -- "CREATE INDEX idem_keys_expires_at_idx ON public.idem_keys USING brin (...) ..."
            EXECUTE regexp_replace(expiry_index, '^CREATE INDEX \S+ ON \S+',
                                   format('CREATE INDEX ON ref.%I', t));
        END IF;
    END LOOP;
END
$$;

-- The request fingerprint, as docs/contract.md §3 defines it: SHA-256 of the scope, a 0x00 byte and the
-- canonical text of the jsonb. (Inlined by hand in the functions below: a call would cost more.)
--   sha256(convert_to(scope, 'UTF8') || '\x00'::bytea || convert_to(request::text, 'UTF8'))

-- ---------------------------------------------------------------------------------------------
-- (a) the PL/pgSQL state machine
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION ref.claim_a(
    p_key     text,
    p_request jsonb DEFAULT NULL,
    p_scope   text DEFAULT '',
    p_ttl     interval DEFAULT '1 day',
    p_lease   interval DEFAULT '1 minute')
RETURNS ref.claim_result
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_fp  bytea;
    r     ref.keys_a;
BEGIN
    IF p_request IS NOT NULL THEN
        v_fp := sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea
                       || convert_to(p_request::text, 'UTF8'));
    END IF;

    LOOP
        INSERT INTO ref.keys_a AS k
               (scope, key, state, attempt, fingerprint, created_at, locked_until, expires_at)
        VALUES (p_scope, p_key, 'pending', 1, v_fp, v_now, v_now + p_lease, v_now + p_ttl)
        ON CONFLICT DO NOTHING
        RETURNING k.attempt, k.expires_at INTO r.attempt, r.expires_at;
        IF FOUND THEN
            RETURN ROW('claimed', true, r.attempt, 'pending', NULL, NULL, NULL, r.expires_at)::ref.claim_result;
        END IF;

        -- the key exists: lock it (waits for a concurrent writer) and look at it
        SELECT * INTO r FROM ref.keys_a
         WHERE scope = p_scope AND key = p_key
           FOR UPDATE;
        EXIT WHEN FOUND;
        -- deleted (reaped) between the INSERT and the SELECT: start again
    END LOOP;

    IF r.fingerprint IS DISTINCT FROM v_fp THEN
        RAISE EXCEPTION 'idempotency key "%" was already used with a different request', p_key
            USING ERRCODE = 'IK001';
    END IF;

    IF r.state = 'succeeded' OR (r.state = 'failed' AND NOT r.retryable) THEN
        RETURN ROW('replay', false, r.attempt, r.state, r.response, r.response_code, NULL,
                   r.expires_at)::ref.claim_result;
    END IF;

    IF r.state = 'pending' AND r.locked_until > v_now THEN
        RETURN ROW('in_progress', false, r.attempt, 'pending', NULL, NULL, r.locked_until - v_now,
                   r.expires_at)::ref.claim_result;
    END IF;

    -- pending with an expired lease, or failed and retryable: take it over
    UPDATE ref.keys_a
       SET state = 'pending', attempt = attempt + 1, locked_until = v_now + p_lease,
           response = NULL, response_code = NULL, completed_at = NULL, retryable = NULL,
           expires_at = greatest(expires_at, v_now + p_ttl)
     WHERE scope = p_scope AND key = p_key
    RETURNING attempt, expires_at INTO r.attempt, r.expires_at;
    RETURN ROW('claimed', false, r.attempt, 'pending', NULL, NULL, NULL, r.expires_at)::ref.claim_result;
END
$$;

-- (a) with the contract's checks of a claim's arguments and privileges, written as the SQL
-- edition writes them (docs/contract.md §4, §7: key, scope, a given lease, read-only transaction,
-- SELECT/INSERT/UPDATE on the table), and nothing else of its rules: what those checks alone cost
-- a PL/pgSQL claim. Made from ref.claim_a's own text, so the two cannot drift apart.
DO $$
BEGIN
    EXECUTE replace(replace(pg_get_functiondef('ref.claim_a'::regproc),
        'FUNCTION ref.claim_a(', 'FUNCTION ref.claim_a_checked('),
        E'BEGIN\n    IF p_request IS NOT NULL THEN', $checks$BEGIN
    IF (p_key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(p_key) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(p_scope) OPERATOR(pg_catalog.<=) 255) IS NOT TRUE
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        RAISE EXCEPTION 'invalid key or scope' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_lease IS NOT NULL THEN
        IF NOT (p_lease OPERATOR(pg_catalog.>) '0'::interval AND p_lease OPERATOR(pg_catalog.<=) '100 years'::interval
                AND (v_now OPERATOR(pg_catalog.+) p_lease) OPERATOR(pg_catalog.>) v_now
                AND (v_now OPERATOR(pg_catalog.+) p_lease) OPERATOR(pg_catalog.<=) (v_now OPERATOR(pg_catalog.+) '100 years'::interval)) THEN
            RAISE EXCEPTION 'invalid lease' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
       OR NOT pg_catalog.has_table_privilege('ref.keys_a'::pg_catalog.regclass, 'SELECT')
       OR NOT pg_catalog.has_table_privilege('ref.keys_a'::pg_catalog.regclass, 'INSERT')
       OR NOT pg_catalog.has_table_privilege('ref.keys_a'::pg_catalog.regclass, 'UPDATE') THEN
        RAISE EXCEPTION 'cannot claim' USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_request IS NOT NULL THEN$checks$);
    IF NOT EXISTS (SELECT FROM pg_proc WHERE proname = 'claim_a_checked'
                                         AND prosrc LIKE '%has_table_privilege%') THEN
        RAISE EXCEPTION 'ref.claim_a_checked was not made';
    END IF;
END
$$;

CREATE FUNCTION ref.complete_a(
    p_key      text,
    p_response jsonb,
    p_code     integer DEFAULT 200,
    p_scope    text DEFAULT '',
    p_attempt  integer DEFAULT NULL)
RETURNS ref.keys_a
LANGUAGE plpgsql
AS $$
DECLARE
    r ref.keys_a;
BEGIN
    UPDATE ref.keys_a
       SET state = 'succeeded', response = p_response, response_code = p_code,
           completed_at = clock_timestamp(), locked_until = NULL, retryable = NULL
     WHERE scope = p_scope AND key = p_key AND state = 'pending'
       AND (p_attempt IS NULL OR attempt = p_attempt)
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN r;
    END IF;

    -- not finished: say why (off the measured path)
    SELECT * INTO r FROM ref.keys_a WHERE scope = p_scope AND key = p_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency key "%" does not exist', p_key USING ERRCODE = 'IK003';
    ELSIF p_attempt IS NOT NULL AND r.attempt <> p_attempt THEN
        RAISE EXCEPTION 'attempt % of idempotency key "%" is stale', p_attempt, p_key
            USING ERRCODE = 'IK002';
    ELSE
        RAISE EXCEPTION 'idempotency key "%" is not pending', p_key USING ERRCODE = 'IK004';
    END IF;
END
$$;

-- (a) for batches: ref.claim_batch_a / ref.complete_batch_a, set-based as a careful author would
-- write them for a batch of new or finished keys: one INSERT ... SELECT ... ORDER BY key ON
-- CONFLICT DO NOTHING (rows inserted in key order, so overlapping batches do not deadlock) and one
-- read of the keys it did not insert; complete: the rows locked in key order (a look-up per key),
-- then one UPDATE of them by ctid.
-- Takeovers, expiry and refused fingerprints are left out (the batch workloads have none), which
-- only makes the reference faster.
CREATE FUNCTION ref.claim_batch_a(
    p_keys     text[],
    p_requests jsonb[],
    p_scope    text DEFAULT '',
    p_ttl      interval DEFAULT '1 day',
    p_lease    interval DEFAULT '1 minute')
RETURNS TABLE (key text, outcome text, inserted boolean, attempt integer, state text,
               response jsonb, response_code integer, expires_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH req AS (
        SELECT u.k, sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea
                           || convert_to(u.r::text, 'UTF8')) AS fp
          FROM unnest(p_keys, p_requests) AS u(k, r)),
    ins AS (
        INSERT INTO ref.keys_a AS t
               (scope, key, state, attempt, fingerprint, created_at, locked_until, expires_at)
        SELECT p_scope, req.k, 'pending', 1, req.fp, v_now, v_now + p_lease, v_now + p_ttl
          FROM req ORDER BY req.k COLLATE "C"
        ON CONFLICT DO NOTHING
        RETURNING t.key, t.attempt, t.expires_at)
    SELECT ins.key, 'claimed'::text, true, ins.attempt, 'pending'::text, NULL::jsonb, NULL::integer,
           ins.expires_at
      FROM ins
    UNION ALL
    SELECT t.key, CASE WHEN t.state = 'succeeded' OR (t.state = 'failed' AND NOT t.retryable)
                       THEN 'replay' ELSE 'in_progress' END,
           false, t.attempt, t.state, t.response, t.response_code, t.expires_at
      FROM req JOIN ref.keys_a AS t ON t.scope = p_scope AND t.key = req.k
     WHERE NOT EXISTS (SELECT FROM ins WHERE ins.key = req.k)
    ORDER BY 1;
END
$$;

CREATE FUNCTION ref.complete_batch_a(
    p_keys      text[],
    p_responses jsonb[],
    p_code      integer DEFAULT 200,
    p_scope     text DEFAULT '')
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_tids  tid[];
    v_resps jsonb[];
    n       bigint;
BEGIN
    -- each key's row locked in key order (one index look-up per key), with its response
    SELECT array_agg(l.tid), array_agg(l.r) INTO v_tids, v_resps
      FROM (SELECT x.tid, u.r
              FROM (SELECT u.k, u.r FROM unnest(p_keys, p_responses) AS u(k, r)
                     ORDER BY u.k COLLATE "C") AS u
             CROSS JOIN LATERAL (SELECT t.ctid AS tid FROM ref.keys_a AS t
                                  WHERE t.scope = p_scope AND t.key = u.k
                                    FOR UPDATE) AS x) AS l;
    -- then updated by ctid, each row's response found by its place (a join with the arrays
    -- would leave the plan to statistics, which a growing table does not have yet)
    UPDATE ref.keys_a AS t
       SET state = 'succeeded', response = v_resps[array_position(v_tids, t.ctid)],
           response_code = p_code, completed_at = v_now, locked_until = NULL, retryable = NULL
     WHERE t.ctid = ANY (v_tids) AND t.state = 'pending';
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> cardinality(p_keys) THEN
        RAISE EXCEPTION 'a key of the batch is not pending' USING ERRCODE = 'IK004';
    END IF;
    RETURN n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- (b) one INSERT ... ON CONFLICT DO UPDATE ... WHERE <takeover> RETURNING xmax = 0
-- ---------------------------------------------------------------------------------------------
-- When the key exists and may not be taken over, ON CONFLICT DO UPDATE still locks the row and
-- returns nothing; the row stays locked, so the SELECT that follows reads the version it saw.
CREATE FUNCTION ref.claim_b(
    p_key     text,
    p_request jsonb DEFAULT NULL,
    p_scope   text DEFAULT '',
    p_ttl     interval DEFAULT '1 day',
    p_lease   interval DEFAULT '1 minute')
RETURNS ref.claim_result
LANGUAGE plpgsql
AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_fp       bytea;
    v_inserted boolean;
    r          ref.keys_b;
BEGIN
    IF p_request IS NOT NULL THEN
        v_fp := sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea
                       || convert_to(p_request::text, 'UTF8'));
    END IF;

    LOOP
        INSERT INTO ref.keys_b AS k
               (scope, key, state, attempt, fingerprint, created_at, locked_until, expires_at)
        VALUES (p_scope, p_key, 'pending', 1, v_fp, v_now, v_now + p_lease, v_now + p_ttl)
        ON CONFLICT (scope, key) DO UPDATE
           SET state = 'pending', attempt = k.attempt + 1, locked_until = excluded.locked_until,
               response = NULL, response_code = NULL, completed_at = NULL, retryable = NULL,
               expires_at = greatest(k.expires_at, excluded.expires_at)
         WHERE k.fingerprint IS NOT DISTINCT FROM excluded.fingerprint
           AND ((k.state = 'pending' AND k.locked_until <= v_now)
                OR (k.state = 'failed' AND k.retryable))
        RETURNING k.attempt, k.expires_at, k.xmax = 0 INTO r.attempt, r.expires_at, v_inserted;
        IF FOUND THEN
            RETURN ROW('claimed', v_inserted, r.attempt, 'pending', NULL, NULL, NULL,
                       r.expires_at)::ref.claim_result;
        END IF;

        -- not taken: a mismatch, a replay or in progress (the row is locked by the INSERT)
        SELECT * INTO r FROM ref.keys_b WHERE scope = p_scope AND key = p_key;
        EXIT WHEN FOUND;
    END LOOP;

    IF r.fingerprint IS DISTINCT FROM v_fp THEN
        RAISE EXCEPTION 'idempotency key "%" was already used with a different request', p_key
            USING ERRCODE = 'IK001';
    END IF;
    IF r.state = 'pending' THEN
        RETURN ROW('in_progress', false, r.attempt, 'pending', NULL, NULL, r.locked_until - v_now,
                   r.expires_at)::ref.claim_result;
    END IF;
    RETURN ROW('replay', false, r.attempt, r.state, r.response, r.response_code, NULL,
               r.expires_at)::ref.claim_result;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- the hand-written reaper: batched DELETE ... USING (SELECT ctid ... FOR UPDATE SKIP LOCKED)
-- ---------------------------------------------------------------------------------------------
-- Same rule as idem_reap: expired (expires_at <= clock), never a pending key with a live lease,
-- never waits for a row lock. Commits after each batch, like idem_reap_all.
CREATE PROCEDURE ref.reap_all(batch_size integer DEFAULT 1000, INOUT reaped bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
    n bigint;
BEGIN
    reaped := 0;
    LOOP
        DELETE FROM ref.keys_reap t
         USING (SELECT ctid FROM ref.keys_reap
                 WHERE expires_at <= clock_timestamp()
                   AND NOT (state = 'pending' AND locked_until > clock_timestamp())
                 LIMIT batch_size
                   FOR UPDATE SKIP LOCKED) d
         WHERE t.ctid = d.ctid;
        GET DIAGNOSTICS n = ROW_COUNT;
        reaped := reaped + n;
        COMMIT;
        EXIT WHEN n < batch_size;
    END LOOP;
END
$$;
