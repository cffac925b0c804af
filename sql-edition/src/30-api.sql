-- The contract's functions (docs/contract.md §2): the same names, argument names, defaults and
-- results as the C edition's. Each checks its arguments in argument order (§4), then that the
-- transaction can write and the privileges (§7), then hands the key to the rules in 20-internal.

CREATE FUNCTION @extschema@.idem_claim(
    key         text,
    request     jsonb DEFAULT NULL,
    scope       text DEFAULT '',
    ttl         interval DEFAULT NULL,
    lease       interval DEFAULT NULL,
    fingerprint bytea DEFAULT NULL,
    wait        interval DEFAULT NULL)
RETURNS @extschema@.idem_claim_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    deadline  timestamptz;
    now_      timestamptz;
    canonical text;
BEGIN
    -- The usual arguments pass in a few simple expressions; anything else goes to the checks
    -- that name what is wrong, in argument order. Each expression's first use in a transaction
    -- costs a claim its set-up (every function and operator in it looked up and its EXECUTE
    -- privilege checked, whether its branch is taken or not), so they are few and small.
    IF @extschema@.idem_sql_usual_key(key, scope) IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF ttl IS NOT NULL OR lease IS NOT NULL THEN
        -- nested: a condition is set up only when it is reached, so an argument left out costs
        -- nothing but its IS NOT NULL
        now_ := pg_catalog.clock_timestamp();
        IF ttl IS NOT NULL THEN
            IF NOT @extschema@.idem_sql_end_ok(now_, ttl) THEN
                PERFORM @extschema@.idem_sql_duration_end(now_, ttl, 'ttl');
            END IF;
        END IF;
        IF lease IS NOT NULL THEN
            IF NOT @extschema@.idem_sql_end_ok(now_, lease) THEN
                PERFORM @extschema@.idem_sql_duration_end(now_, lease, 'lease');
            END IF;
        END IF;
    END IF;
    IF wait IS NOT NULL OR fingerprint IS NOT NULL THEN
        IF wait IS NOT NULL THEN
            deadline := @extschema@.idem_sql_deadline(wait);
        END IF;
        IF fingerprint IS NOT NULL THEN
            PERFORM @extschema@.idem_sql_check_fingerprint(fingerprint, NULL);
        END IF;
    END IF;
    IF @extschema@.idem_sql_may_write() IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_may('idem_claim()', '{SELECT,INSERT,UPDATE}');
    END IF;
    IF fingerprint IS NOT NULL OR request IS NULL THEN
        -- a given fingerprint is compared as given (§3)
        RETURN @extschema@.idem_sql_claim_key(scope, key, fingerprint, NULL, ttl, lease, deadline, false, false);
    END IF;
    -- idem_sql_fingerprint's fast case, inline: jsonb's text is canonical unless it may hold a
    -- number with trailing fraction zeros, which needs a '.' (a statement apart calls it only then)
    -- (convert_to(..., 'SQL_ASCII') is the text's bytes in the database's encoding, unconverted)
    canonical := request::text;
    IF pg_catalog.strpos(canonical, '.') OPERATOR(pg_catalog.<>) 0 THEN
        IF canonical OPERATOR(pg_catalog.~) '\.[0-9]*0([^0-9]|$)' THEN
            RETURN @extschema@.idem_sql_claim_key(scope, key, @extschema@.idem_sql_fingerprint(scope, request, true),
                                                  request, ttl, lease, deadline, false, false);
        END IF;
    END IF;
    RETURN @extschema@.idem_sql_claim_key(scope, key,
        pg_catalog.sha256(pg_catalog.convert_to(scope, 'SQL_ASCII')
                          OPERATOR(pg_catalog.||) '\x00'::bytea
                          OPERATOR(pg_catalog.||) pg_catalog.convert_to(canonical, 'SQL_ASCII')),
        request, ttl, lease, deadline, false, false);
END
$fn$;

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
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    -- The usual arguments pass in a few simple expressions (as in idem_claim); anything else
    -- goes to the checks that name what is wrong, in argument order.
    IF @extschema@.idem_sql_usual_key(key, scope) IS NOT TRUE OR response_code IS NULL THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        IF response_code IS NULL THEN
            PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
        END IF;
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF ttl IS NOT NULL OR headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_check_finish(ttl, headers);
    END IF;
    IF @extschema@.idem_sql_may_write() IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_may('idem_complete()', '{SELECT,INSERT,UPDATE}');
    END IF;

    RETURN @extschema@.idem_sql_finish_key(scope, key, 'succeeded', response, response_code, NULL,
                                           attempt, ttl, body, headers, false);
END
$fn$;

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
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    -- as idem_complete
    IF @extschema@.idem_sql_usual_key(key, scope) IS NOT TRUE OR response_code IS NULL OR retryable IS NULL THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
        PERFORM @extschema@.idem_sql_not_null(retryable, 'retryable');
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF ttl IS NOT NULL OR headers IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_check_finish(ttl, headers);
    END IF;
    IF @extschema@.idem_sql_may_write() IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_may('idem_fail()', '{SELECT,INSERT,UPDATE}');
    END IF;
    RETURN @extschema@.idem_sql_finish_key(scope, key, 'failed', response, response_code, retryable,
                                           attempt, ttl, body, headers, false);
END
$fn$;

CREATE FUNCTION @extschema@.idem_lookup(
    key   text,
    scope text DEFAULT '')
RETURNS @extschema@.idem_keys
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    r    @extschema@.idem_keys;
    now_ timestamptz;
BEGIN
    -- as idem_claim
    IF @extschema@.idem_sql_usual_key(key, scope) IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'SELECT') THEN
        PERFORM @extschema@.idem_sql_may('idem_lookup()', '{SELECT}');
    END IF;
    SELECT k.* INTO r FROM @extschema@.idem_keys AS k
     WHERE k.scope OPERATOR(pg_catalog.=) idem_lookup.scope AND k.key OPERATOR(pg_catalog.=) idem_lookup.key;
    now_ := pg_catalog.clock_timestamp();
    -- §9.1: an expired key is absent
    IF NOT FOUND OR (r.expires_at OPERATOR(pg_catalog.<=) now_
                     AND NOT (r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                              AND r.locked_until OPERATOR(pg_catalog.>) now_)) THEN
        RETURN NULL;
    END IF;
    RETURN r;
END
$fn$;

CREATE FUNCTION @extschema@.idem_extend(
    key     text,
    attempt integer,
    lease   interval,
    scope   text DEFAULT '')
RETURNS @extschema@.idem_keys
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
    PERFORM @extschema@.idem_sql_not_null(attempt, 'attempt');
    PERFORM @extschema@.idem_sql_not_null(lease, 'lease');
    PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), lease, 'lease');
    PERFORM @extschema@.idem_sql_check_scope(scope);
    PERFORM @extschema@.idem_sql_may('idem_extend()', '{SELECT,UPDATE}');
    RETURN @extschema@.idem_sql_lease_key(scope, key, attempt, lease);
END
$fn$;

CREATE FUNCTION @extschema@.idem_release(
    key     text,
    attempt integer,
    scope   text DEFAULT '')
RETURNS @extschema@.idem_keys
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
BEGIN
    PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
    PERFORM @extschema@.idem_sql_not_null(attempt, 'attempt');
    PERFORM @extschema@.idem_sql_check_scope(scope);
    PERFORM @extschema@.idem_sql_may('idem_release()', '{SELECT,UPDATE}');
    RETURN @extschema@.idem_sql_lease_key(scope, key, attempt, NULL);
END
$fn$;

CREATE FUNCTION @extschema@.idem_forget(
    key   text,
    scope text DEFAULT '',
    force boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    r    @extschema@.idem_keys;
BEGIN
    PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
    PERFORM @extschema@.idem_sql_check_scope(scope);
    PERFORM @extschema@.idem_sql_not_null(force, 'force');
    PERFORM @extschema@.idem_sql_may('idem_forget()', '{SELECT,DELETE}');
    -- The delete waits for a concurrent writer of the key, as DELETE does, and then sees its
    -- latest version; a live lease refuses (IK005), the error undoing the delete.
    DELETE FROM @extschema@.idem_keys AS k
     WHERE k.scope OPERATOR(pg_catalog.=) idem_forget.scope AND k.key OPERATOR(pg_catalog.=) idem_forget.key
    RETURNING k.* INTO r;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT force AND r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
       AND r.locked_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN
        RAISE EXCEPTION 'idempotency key "%" is in progress', key
            USING ERRCODE = 'IK005',
                  DETAIL = pg_catalog.format('Its lease of attempt %s has not ended.', r.attempt),
                  HINT = 'Wait for the lease to end, or pass force => true.';
    END IF;
    RETURN true;
END
$fn$;

-- Deletes up to max_rows expired keys (§9.1), never waiting for a row another transaction holds.
-- Locking the rows it deletes (SKIP LOCKED) needs UPDATE besides DELETE and SELECT
-- (docs/editions.md). New BRIN ranges are summarized first when the caller owns the table, as
-- summarizing requires.
CREATE FUNCTION @extschema@.idem_reap(max_rows integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
DECLARE
    n    bigint;
    now_ timestamptz;
    batch integer := max_rows;
BEGIN
    IF max_rows IS NOT NULL AND max_rows OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'argument "max_rows" must be at least 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF batch IS NULL THEN
        batch := @extschema@.idem_sql_setting('idempotency.reaper_batch_size', 1000, 1, 1000000, NULL);
    END IF;
    PERFORM @extschema@.idem_sql_may('idem_reap()', '{SELECT,UPDATE,DELETE}');
    IF pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class AS c
                                WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass),
                              'USAGE') THEN
        PERFORM pg_catalog.brin_summarize_new_values('@extschema@.idem_keys_expires_at_idx'::pg_catalog.regclass);
    END IF;
    now_ := pg_catalog.clock_timestamp();
    DELETE FROM @extschema@.idem_keys AS k
     WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
           SELECT e.ctid FROM @extschema@.idem_keys AS e
            WHERE e.expires_at OPERATOR(pg_catalog.<=) now_
              AND NOT (e.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                       AND e.locked_until OPERATOR(pg_catalog.>) now_)
            LIMIT batch
              FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- Commits after each batch, so it must be called outside an explicit transaction block. No SET
-- clause (a procedure with one cannot commit): every name is schema-qualified instead.
CREATE PROCEDURE @extschema@.idem_reap_all(
    batch_size integer DEFAULT NULL,
    INOUT reaped bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $fn$
DECLARE
    n bigint;
    batch integer := batch_size;
BEGIN
    IF batch_size OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION 'argument "batch_size" must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF batch IS NULL THEN
        batch := @extschema@.idem_sql_setting('idempotency.reaper_batch_size', 1000, 1, 1000000, NULL);
    END IF;
    reaped := 0;
    LOOP
        n := @extschema@.idem_reap(batch);
        reaped := reaped OPERATOR(pg_catalog.+) n;
        COMMIT;
        EXIT WHEN n OPERATOR(pg_catalog.<) batch;
    END LOOP;
END
$fn$;

-- docs/contract.md §11: every key of one scope claimed by idem_claim's rules, in the primary
-- key's order (so overlapping batches never deadlock), one row per distinct key. The arguments are
-- checked set-wise before any key is read; the keys are then read, inserted and answered set-wise
-- where that decides as idem_claim would, and go one by one to idem_claim's rules otherwise.
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
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 100
AS $fn$
#variable_conflict use_variable
DECLARE
    lower_   integer;
    n        integer;
    deadline timestamptz;
    res      @extschema@.idem_claim_result;
    m        integer;
    bad_key  text;
    bad_first bigint;
    bad_next bigint;
    dk       text[];
    dfp      bytea[];
    dreq     jsonb[];
    kinds    text[];
    answers  @extschema@.idem_claim_result[];
    run_from integer;
    run_end  integer;
    nnew     integer;
    got      bigint;
    run_ok   boolean;
    set_ok   boolean := false;
    own_xid  boolean;
    now_     timestamptz;
    expires  timestamptz;
    until_   timestamptz;
    new_state @extschema@.idem_state;
BEGIN
    -- The usual arguments pass in simple tests, in argument order; anything else goes to the
    -- checks that name what is wrong (a call each costs a batch more than several tests).
    IF keys IS NULL OR pg_catalog.array_ndims(keys) OPERATOR(pg_catalog.>) 1
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) ''
       OR EXISTS (SELECT FROM pg_catalog.unnest(keys) AS u(k)
                   WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.~) '[^ -~]' OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.<) 1
                         OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) 255) THEN
        PERFORM @extschema@.idem_sql_batch_keys(keys);
    END IF;
    lower_ := coalesce(pg_catalog.array_lower(keys, 1), 1);
    n := coalesce(pg_catalog.cardinality(keys), 0);
    IF scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF requests IS NOT NULL AND (pg_catalog.array_ndims(requests) OPERATOR(pg_catalog.>) 1
                                 OR pg_catalog.cardinality(requests) OPERATOR(pg_catalog.<>) n) THEN
        PERFORM @extschema@.idem_sql_per_key(requests, 'requests', n);
    END IF;
    IF fingerprints IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_per_key(fingerprints, 'fingerprints', n);
        -- the first element of a wrong length raises
        PERFORM @extschema@.idem_sql_check_fingerprint(f.fp, (f.i OPERATOR(pg_catalog.+) pg_catalog.array_lower(fingerprints, 1) OPERATOR(pg_catalog.-) 1)::integer)
           FROM (SELECT u.fp, u.i FROM pg_catalog.unnest(fingerprints) WITH ORDINALITY AS u(fp, i)
                  WHERE pg_catalog.length(u.fp) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length(u.fp) OPERATOR(pg_catalog.>) 64
                  ORDER BY u.i LIMIT 1) AS f;
    END IF;
    IF ttl IS NOT NULL OR lease IS NOT NULL THEN
        now_ := pg_catalog.clock_timestamp();
        IF ttl IS NOT NULL AND NOT @extschema@.idem_sql_end_ok(now_, ttl) THEN
            PERFORM @extschema@.idem_sql_duration_end(now_, ttl, 'ttl');
        END IF;
        IF lease IS NOT NULL AND NOT @extschema@.idem_sql_end_ok(now_, lease) THEN
            PERFORM @extschema@.idem_sql_duration_end(now_, lease, 'lease');
        END IF;
    END IF;
    IF wait IS NOT NULL THEN
        deadline := @extschema@.idem_sql_deadline(wait);
    END IF;
    IF applied IS NULL THEN
        PERFORM @extschema@.idem_sql_not_null(applied, 'applied');
    END IF;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    IF @extschema@.idem_sql_may_write() IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_may('idem_claim_batch()', '{SELECT,INSERT,UPDATE}');
    END IF;
    -- Every element with the fingerprint idem_claim would store for it (idem_sql_fingerprint's
    -- fast case inline, as in idem_claim: a call per key costs more) and, for a key stored by 1.1
    -- (§9.6), its request when no fingerprint was given; sorted by key, each repeat after the one
    -- before it. The distinct keys in that order are what the batch claims; a repeat whose
    -- fingerprint differs from the one before it is IK001, the first in that order (as C does),
    -- before anything is written.
    SELECT pg_catalog.array_agg(d.k) FILTER (WHERE d.prev_i IS NULL),
           pg_catalog.array_agg(d.fp) FILTER (WHERE d.prev_i IS NULL),
           pg_catalog.array_agg(d.rq) FILTER (WHERE d.prev_i IS NULL),
           (pg_catalog.array_agg(d.k) FILTER (WHERE d.refused))[1],
           (pg_catalog.array_agg(d.prev_i) FILTER (WHERE d.refused))[1],
           (pg_catalog.array_agg(d.i) FILTER (WHERE d.refused))[1]
      INTO dk, dfp, dreq, bad_key, bad_first, bad_next
      FROM (SELECT e.k, e.fp, e.rq, e.i, pg_catalog.lag(e.i) OVER w AS prev_i,
                   pg_catalog.lag(e.i) OVER w IS NOT NULL
                   AND CASE WHEN pg_catalog.lag(e.fp) OVER w IS NULL THEN e.fp IS NOT NULL
                            WHEN e.fp IS NULL THEN true
                            ELSE NOT pg_catalog.lag(e.fp) OVER w OPERATOR(pg_catalog.=) e.fp END AS refused
              FROM (SELECT a.k, a.i, CASE WHEN a.f IS NULL THEN a.r END AS rq,
                           coalesce(a.f,
                               CASE WHEN a.r IS NULL THEN NULL
                                    WHEN a.r::text OPERATOR(pg_catalog.~) '\.[0-9]*0([^0-9]|$)'
                                    THEN @extschema@.idem_sql_fingerprint(scope, a.r, true)
                                    ELSE pg_catalog.sha256(pg_catalog.convert_to(scope, pg_catalog.getdatabaseencoding())
                                             OPERATOR(pg_catalog.||) '\x00'::bytea
                                             OPERATOR(pg_catalog.||) pg_catalog.convert_to(a.r::text, pg_catalog.getdatabaseencoding())) END) AS fp
                      FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(requests), pg_catalog.unnest(fingerprints))
                           WITH ORDINALITY AS a(k, r, f, i)) AS e
            WINDOW w AS (PARTITION BY (e.k COLLATE pg_catalog."C") ORDER BY e.i)
             ORDER BY (e.k COLLATE pg_catalog."C"), e.i) AS d;
    IF bad_key IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency key "%" appears twice in argument "keys" with different requests', bad_key
            USING ERRCODE = 'IK001', COLUMN = bad_key,
                  DETAIL = pg_catalog.format('keys[%s] and keys[%s] are the same key.',
                                             lower_ OPERATOR(pg_catalog.+) bad_first OPERATOR(pg_catalog.-) 1,
                                             lower_ OPERATOR(pg_catalog.+) bad_next OPERATOR(pg_catalog.-) 1);
    END IF;
    m := pg_catalog.cardinality(dk);

    -- Set-wise at READ COMMITTED without `wait` (docs/editions.md, "How batches are built"): one
    -- read of every key's latest committed version; keys it decides without a write (absent:
    -- inserted; a replay; a live lease) are handled together, the others ("slow": a version
    -- being written, this transaction's own, expired, a fingerprint to compare by 1.1's rule or
    -- refused, a takeover) one by one by idem_sql_claim_key. Everything still happens in key
    -- order: a run of keys between two slow keys is inserted by one INSERT in key order, then
    -- the slow key is claimed, and so on.
    IF deadline IS NULL
       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        now_ := pg_catalog.clock_timestamp();
        set_ok := (ttl IS NULL OR @extschema@.idem_sql_end_ok(now_, ttl))
                  AND (lease IS NULL OR applied OR @extschema@.idem_sql_end_ok(now_, lease));
        IF set_ok THEN
            -- the ends a new key gets, as idem_sql_claim_key computes them; a setting it would
            -- refuse sends the batch to the loop, which raises it where the loop first writes
            BEGIN
                expires := CASE WHEN ttl IS NOT NULL THEN now_ OPERATOR(pg_catalog.+) ttl
                                WHEN coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '') OPERATOR(pg_catalog.=) ''
                                THEN now_ OPERATOR(pg_catalog.+) '86400 seconds'::interval
                                ELSE now_ OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
                                         @extschema@.idem_sql_setting('idempotency.default_ttl', 86400, 1, 2147483647, 's')) END;
                until_ := CASE WHEN applied THEN NULL
                               WHEN lease IS NOT NULL THEN now_ OPERATOR(pg_catalog.+) lease
                               WHEN coalesce(pg_catalog.current_setting('idempotency.default_lease', true), '') OPERATOR(pg_catalog.=) ''
                               THEN now_ OPERATOR(pg_catalog.+) '60 seconds'::interval
                               ELSE now_ OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
                                        @extschema@.idem_sql_setting('idempotency.default_lease', 60000, 1, 2147483647, 'ms')
                                        OPERATOR(pg_catalog./) 1000.0) END;
            EXCEPTION WHEN invalid_parameter_value THEN
                set_ok := false;
            END;
        END IF;
    END IF;
    IF set_ok THEN
        new_state := CASE WHEN applied THEN 'succeeded'::@extschema@.idem_state ELSE 'pending'::@extschema@.idem_state END;
        own_xid := pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL;
        -- idem_sql_claim_key's decisions (§2 steps 2 to 6, §9.1) on what this one read sees
        SELECT pg_catalog.array_agg(p.kind), pg_catalog.array_agg(p.res) INTO kinds, answers
          FROM (SELECT c.kind,
                       CASE c.kind
                       WHEN 'new' THEN ROW('claimed', true, 1, new_state, NULL, NULL, NULL, expires,
                                           NULL, NULL, NULL)::@extschema@.idem_claim_result
                       WHEN 'replay' THEN ROW('replay', false, c.attempt, c.state, c.response, c.response_code,
                                              NULL, c.expires_at, NULL, NULL, NULL)::@extschema@.idem_claim_result
                       WHEN 'in_progress' THEN ROW('in_progress', false, c.attempt, c.state, c.response, c.response_code,
                                                   c.locked_until OPERATOR(pg_catalog.-) now_, c.expires_at,
                                                   least(greatest(pg_catalog.ceil(EXTRACT(epoch FROM c.locked_until OPERATOR(pg_catalog.-) now_)), 1),
                                                         2147483647)::integer,
                                                   NULL, NULL)::@extschema@.idem_claim_result
                       END AS res
                  FROM (SELECT d.n, k.attempt, k.state, k.response, k.response_code, k.locked_until, k.expires_at,
                               CASE
                               WHEN k.key IS NULL THEN 'new'
                               WHEN NOT k.xmax OPERATOR(pg_catalog.=) '0'::xid THEN 'slow'
                               WHEN own_xid AND coalesce(@extschema@.idem_sql_xact_status(k.xmin) OPERATOR(pg_catalog.=) 'in progress', false) THEN 'slow'
                               WHEN k.expires_at OPERATOR(pg_catalog.<=) now_
                                    AND NOT (k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                                             AND k.locked_until OPERATOR(pg_catalog.>) now_) THEN 'slow'
                               WHEN CASE WHEN k.fingerprint IS NULL THEN d.fp IS NOT NULL
                                         WHEN d.fp IS NULL THEN true
                                         ELSE NOT k.fingerprint OPERATOR(pg_catalog.=) d.fp END THEN 'slow'
                               WHEN k.state OPERATOR(pg_catalog.=) 'succeeded'::@extschema@.idem_state
                                    OR (k.state OPERATOR(pg_catalog.=) 'failed'::@extschema@.idem_state
                                        AND NOT coalesce(k.retryable, false)) THEN 'replay'
                               WHEN k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                                    AND k.locked_until OPERATOR(pg_catalog.>) now_ THEN 'in_progress'
                               ELSE 'slow'
                               END AS kind
                          FROM ROWS FROM (pg_catalog.unnest(dk), pg_catalog.unnest(dfp)) WITH ORDINALITY AS d(k, fp, n)
                          -- one look-up per key (a join could scan the whole scope)
                          LEFT JOIN LATERAL (
                               SELECT v.key, v.attempt, v.state, v.response, v.response_code, v.locked_until,
                                      v.expires_at, v.fingerprint, v.retryable, v.xmin, v.xmax
                                 FROM @extschema@.idem_keys AS v
                                WHERE v.scope OPERATOR(pg_catalog.=) scope
                                  AND v.key OPERATOR(pg_catalog.=) (d.k COLLATE pg_catalog."C")
                               OFFSET 0) AS k ON true) AS c
                 ORDER BY c.n) AS p;
    END IF;

    -- Runs of keys decided set-wise, each ended by a slow key (m + 1 ends the last run). Without
    -- the set-wise read (kinds is NULL) all the keys are one run that the loop below claims: with
    -- `wait` (it bounds the whole call, which idem_sql_claim_key keeps to), under a transaction
    -- snapshot, or when a setting is refused.
    run_from := 1;
    FOREACH run_end IN ARRAY pg_catalog.array_positions(kinds, 'slow') OPERATOR(pg_catalog.||) (m OPERATOR(pg_catalog.+) 1) LOOP
        IF set_ok AND run_end OPERATOR(pg_catalog.>) run_from THEN
            -- the run run_from .. run_end - 1: its new keys inserted in key order, then every row answered
            run_ok := true;
            nnew := pg_catalog.cardinality(pg_catalog.array_positions(kinds[run_from:run_end OPERATOR(pg_catalog.-) 1], 'new'));
            IF nnew OPERATOR(pg_catalog.=) 1 THEN
                INSERT INTO @extschema@.idem_keys AS k
                       (scope, key, state, attempt, fingerprint, created_at, expires_at, locked_until,
                        completed_at, claimed_at)
                SELECT scope, u.k, new_state, 1, u.fp, now_, expires, until_,
                       CASE WHEN applied THEN now_ END, now_
                  FROM ROWS FROM (pg_catalog.unnest(dk[run_from:run_end OPERATOR(pg_catalog.-) 1]),
                                  pg_catalog.unnest(dfp[run_from:run_end OPERATOR(pg_catalog.-) 1]),
                                  pg_catalog.unnest(kinds[run_from:run_end OPERATOR(pg_catalog.-) 1])) AS u(k, fp, kind)
                 WHERE u.kind OPERATOR(pg_catalog.=) 'new'
                ON CONFLICT DO NOTHING;
                run_ok := FOUND;
            ELSIF nnew OPERATOR(pg_catalog.>) 1 THEN
                -- A key inserted meanwhile by another transaction (waited for by the insert)
                -- or hidden by row-level security is not inserted: then the run's insertions
                -- are undone and its keys claimed one by one, so that nothing after that key
                -- stays locked while it is claimed (the loop's lock order).
                BEGIN
                    INSERT INTO @extschema@.idem_keys AS k
                           (scope, key, state, attempt, fingerprint, created_at, expires_at, locked_until,
                            completed_at, claimed_at)
                    SELECT scope, u.k, new_state, 1, u.fp, now_, expires, until_,
                           CASE WHEN applied THEN now_ END, now_
                      FROM ROWS FROM (pg_catalog.unnest(dk[run_from:run_end OPERATOR(pg_catalog.-) 1]),
                                      pg_catalog.unnest(dfp[run_from:run_end OPERATOR(pg_catalog.-) 1]),
                                      pg_catalog.unnest(kinds[run_from:run_end OPERATOR(pg_catalog.-) 1])) WITH ORDINALITY AS u(k, fp, kind, n)
                     WHERE u.kind OPERATOR(pg_catalog.=) 'new'
                     ORDER BY u.n
                    ON CONFLICT DO NOTHING;
                    GET DIAGNOSTICS got = ROW_COUNT;
                    IF got OPERATOR(pg_catalog.<>) nnew THEN
                        RAISE SQLSTATE 'IKW01';
                    END IF;
                EXCEPTION WHEN SQLSTATE 'IKW01' THEN
                    run_ok := false;
                END;
            END IF;
            IF run_ok THEN
                RETURN QUERY
                    SELECT u.k, u.outcome, u.inserted, u.attempt, u.state, u.response, u.response_code,
                           u.retry_after_s, u.expires_at
                      FROM ROWS FROM (pg_catalog.unnest(dk[run_from:run_end OPERATOR(pg_catalog.-) 1]),
                                      pg_catalog.unnest(answers[run_from:run_end OPERATOR(pg_catalog.-) 1]))
                           WITH ORDINALITY AS u(k, outcome, inserted, attempt, state, response, response_code,
                                                retry_after, expires_at, retry_after_s, response_body,
                                                response_headers, n)
                     ORDER BY u.n;
                -- the run answered: its slow key is left, or nothing after the last run
                EXIT WHEN run_end OPERATOR(pg_catalog.>) m;
                run_from := run_end;
            END IF;
        END IF;
        -- one by one, in key order: the slow key, after the run's keys when it was not answered
        FOR j IN run_from .. least(run_end, m) LOOP
            res := @extschema@.idem_sql_claim_key(scope, dk[j], dfp[j], dreq[j], ttl, lease, deadline, applied, true);
            key := dk[j];
            outcome := res.outcome;
            inserted := res.inserted;
            attempt := res.attempt;
            state := res.state;
            response := res.response;
            response_code := res.response_code;
            retry_after_s := res.retry_after_s;
            expires_at := res.expires_at;
            RETURN NEXT;
        END LOOP;
        run_from := run_end OPERATOR(pg_catalog.+) 1;
    END LOOP;
END
$fn$;

-- docs/contract.md §11: finishes the keys a batch claimed, all or nothing, in the primary key's
-- order; returns how many.
CREATE FUNCTION @extschema@.idem_complete_batch(
    keys          text[],
    scope         text DEFAULT '',
    attempts      integer[] DEFAULT NULL,
    responses     jsonb[] DEFAULT NULL,
    response_code integer DEFAULT 200,
    ttl           interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $fn$
#variable_conflict use_variable
DECLARE
    lower_ integer;
    n      integer;
    e      record;
    dk       text[];
    datt     integer[];
    dresp    jsonb[];
    finished integer[];
    now_     timestamptz;
    tids     tid[];
    latt     integer[];
    lresp    jsonb[];
    done_keys text[];
    places   jsonb;
BEGIN
    -- the usual arguments pass in simple tests, in argument order (as in idem_claim_batch)
    IF keys IS NULL OR pg_catalog.array_ndims(keys) OPERATOR(pg_catalog.>) 1
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) ''
       OR EXISTS (SELECT FROM pg_catalog.unnest(keys) AS u(k)
                   WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.~) '[^ -~]' OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.<) 1
                         OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) 255) THEN
        PERFORM @extschema@.idem_sql_batch_keys(keys);
    END IF;
    lower_ := coalesce(pg_catalog.array_lower(keys, 1), 1);
    n := coalesce(pg_catalog.cardinality(keys), 0);
    IF scope IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF attempts IS NOT NULL AND (pg_catalog.array_ndims(attempts) OPERATOR(pg_catalog.>) 1
                                 OR pg_catalog.cardinality(attempts) OPERATOR(pg_catalog.<>) n) THEN
        PERFORM @extschema@.idem_sql_per_key(attempts, 'attempts', n);
    END IF;
    IF responses IS NOT NULL AND (pg_catalog.array_ndims(responses) OPERATOR(pg_catalog.>) 1
                                  OR pg_catalog.cardinality(responses) OPERATOR(pg_catalog.<>) n) THEN
        PERFORM @extschema@.idem_sql_per_key(responses, 'responses', n);
    END IF;
    IF response_code IS NULL THEN
        PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
    END IF;
    IF ttl IS NOT NULL AND NOT @extschema@.idem_sql_end_ok(pg_catalog.clock_timestamp(), ttl) THEN
        PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), ttl, 'ttl');
    END IF;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN 0;
    END IF;
    -- a key finished twice is a mistake in the caller's list (its second finish would be IK004)
    FOR e IN
        SELECT a.k, a.i AS first_i, b.i AS next_i
          FROM pg_catalog.unnest(keys) WITH ORDINALITY AS a(k, i)
          JOIN pg_catalog.unnest(keys) WITH ORDINALITY AS b(k, i)
            ON (a.k COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) b.k AND a.i OPERATOR(pg_catalog.<) b.i
         ORDER BY (a.k COLLATE pg_catalog."C"), a.i, b.i
         LIMIT 1
    LOOP
        RAISE EXCEPTION 'argument "keys" repeats idempotency key "%"', e.k
            USING ERRCODE = 'invalid_parameter_value', COLUMN = e.k,
                  DETAIL = pg_catalog.format('keys[%s] and keys[%s] are the same key.',
                                             lower_ OPERATOR(pg_catalog.+) e.first_i OPERATOR(pg_catalog.-) 1,
                                             lower_ OPERATOR(pg_catalog.+) e.next_i OPERATOR(pg_catalog.-) 1);
    END LOOP;
    IF @extschema@.idem_sql_may_write() IS NOT TRUE THEN
        PERFORM @extschema@.idem_sql_may('idem_complete_batch()', '{SELECT,INSERT,UPDATE}');
    END IF;
    IF attempts IS NOT NULL THEN
        attempts := ARRAY(SELECT u.x FROM pg_catalog.unnest(attempts) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;
    IF responses IS NOT NULL THEN
        responses := ARRAY(SELECT u.x FROM pg_catalog.unnest(responses) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;
    -- the keys in the primary key's order, each with its attempt and response
    SELECT pg_catalog.array_agg(s.k), pg_catalog.array_agg(s.att), pg_catalog.array_agg(s.resp)
      INTO dk, datt, dresp
      FROM (SELECT a.k, attempts[a.i] AS att, responses[a.i] AS resp
              FROM pg_catalog.unnest(keys) WITH ORDINALITY AS a(k, i)
             ORDER BY (a.k COLLATE pg_catalog."C")) AS s;
    now_ := pg_catalog.clock_timestamp();
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
       AND (ttl IS NULL OR @extschema@.idem_sql_end_ok(now_, ttl)) THEN
        -- Set-wise (docs/editions.md, "How batches are built"): every key's row locked in key
        -- order by one statement, so that overlapping batches wait for each other as the loop's
        -- updates would; then one UPDATE finishes the keys that qualify as idem_sql_finish_key's
        -- would, on the versions now locked.
        SELECT pg_catalog.array_agg(l.t), pg_catalog.array_agg(l.att), pg_catalog.array_agg(l.resp)
          INTO tids, latt, lresp
          FROM (SELECT r.t, d.n, d.att, d.resp
                  FROM ROWS FROM (pg_catalog.unnest(dk), pg_catalog.unnest(datt), pg_catalog.unnest(dresp))
                       WITH ORDINALITY AS d(k, att, resp, n)
                 CROSS JOIN LATERAL (
                       SELECT k.ctid AS t FROM @extschema@.idem_keys AS k
                        WHERE k.scope OPERATOR(pg_catalog.=) scope
                          AND k.key OPERATOR(pg_catalog.=) (d.k COLLATE pg_catalog."C")
                          FOR NO KEY UPDATE) AS r
                 ORDER BY d.n) AS l;
        -- (A lateral look-up per key, in the keys' order, locks each row as it is found: a join
        -- could scan the scope's rows instead. The UPDATE finds the locked versions by ctid and
        -- each one's values by its place in the arrays, looked up in a jsonb object: a join with
        -- the arrays would leave the plan to statistics, which a growing table does not have yet,
        -- and array_position() would cost a batch the square of its size.)
        places := (SELECT pg_catalog.jsonb_object_agg(l.t::text, l.i)
                     FROM pg_catalog.unnest(tids) WITH ORDINALITY AS l(t, i));
        WITH u AS (
            UPDATE @extschema@.idem_keys AS k
               SET state = 'succeeded'::@extschema@.idem_state,
                   response = lresp[(places OPERATOR(pg_catalog.->>) k.ctid::text)::integer],
                   response_code = response_code,
                   response_body = NULL, response_headers = NULL, retryable = NULL,
                   completed_at = now_, locked_until = NULL,
                   expires_at = coalesce(now_ OPERATOR(pg_catalog.+) ttl, k.expires_at)
             WHERE k.ctid OPERATOR(pg_catalog.=) ANY (tids)
               AND k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
               AND (attempts IS NULL
                    OR latt[(places OPERATOR(pg_catalog.->>) k.ctid::text)::integer] IS NULL
                    OR k.attempt OPERATOR(pg_catalog.=) latt[(places OPERATOR(pg_catalog.->>) k.ctid::text)::integer])
               AND (k.expires_at OPERATOR(pg_catalog.>) now_ OR k.locked_until OPERATOR(pg_catalog.>) now_)
            RETURNING k.key)
        SELECT pg_catalog.array_agg(u.key) INTO done_keys FROM u;
        IF coalesce(pg_catalog.cardinality(done_keys), 0) OPERATOR(pg_catalog.=) n THEN
            RETURN n;
        END IF;
        finished := ARRAY(SELECT d.n::integer FROM pg_catalog.unnest(dk) WITH ORDINALITY AS d(k, n)
                           WHERE (d.k COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) ANY (done_keys));
        -- The first key in key order that did not qualify gets what idem_sql_finish_key makes of
        -- it: its error, as the loop raises it first (undoing the batch). Should it qualify now
        -- (a key absent from the lock's read, written since), the keys after it are finished
        -- one by one as the loop would, all but those the UPDATE already finished.
        FOR j IN 1 .. n LOOP
            CONTINUE WHEN j OPERATOR(pg_catalog.=) ANY (finished);
            PERFORM @extschema@.idem_sql_finish_key(scope, dk[j], 'succeeded', dresp[j], response_code,
                NULL, datt[j], ttl, NULL, NULL, true);
        END LOOP;
        RETURN n;
    END IF;
    -- one by one, in key order: under a transaction snapshot (where a lock of a later key could
    -- raise 40001 before an earlier key's error), or with a ttl refused at this time
    FOR j IN 1 .. n LOOP
        PERFORM @extschema@.idem_sql_finish_key(scope, dk[j], 'succeeded', dresp[j], response_code,
            NULL, datt[j], ttl, NULL, NULL, true);
    END LOOP;
    RETURN n;
END
$fn$;
