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
    -- privilege checked, whether its branch is taken or not), so they are few and small: a key
    -- of 1 to 255 printable ASCII characters (one byte each) is one regular expression.
    IF (key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255) IS NOT TRUE
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        PERFORM @extschema@.idem_sql_check_scope(scope);
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
    IF wait IS NOT NULL OR fingerprint IS NOT NULL THEN
        IF wait IS NOT NULL THEN
            deadline := @extschema@.idem_sql_deadline(wait);
        END IF;
        IF fingerprint IS NOT NULL THEN
            PERFORM @extschema@.idem_sql_check_fingerprint(fingerprint, NULL);
        END IF;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'SELECT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'INSERT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'UPDATE') THEN
        PERFORM @extschema@.idem_sql_may('idem_claim()', '{SELECT,INSERT,UPDATE}');
    END IF;
    IF fingerprint IS NOT NULL OR request IS NULL THEN
        -- a given fingerprint is compared as given (§3)
        RETURN @extschema@.idem_sql_claim_key(scope, key, fingerprint, NULL, ttl, lease, deadline, false, false);
    END IF;
    -- idem_sql_fingerprint's fast case, inline: jsonb's text is canonical unless it may hold a
    -- number with trailing fraction zeros, which needs a '.' (a statement apart calls it only then)
    canonical := request::text;
    IF pg_catalog.strpos(canonical, '.') OPERATOR(pg_catalog.<>) 0
       AND canonical OPERATOR(pg_catalog.~) '\.[0-9]*0([^0-9]|$)' THEN
        RETURN @extschema@.idem_sql_claim_key(scope, key, @extschema@.idem_sql_fingerprint(scope, request, true),
                                              request, ttl, lease, deadline, false, false);
    END IF;
    RETURN @extschema@.idem_sql_claim_key(scope, key,
        pg_catalog.sha256(pg_catalog.convert_to(scope, pg_catalog.getdatabaseencoding())
                          OPERATOR(pg_catalog.||) '\x00'::bytea
                          OPERATOR(pg_catalog.||) pg_catalog.convert_to(canonical, pg_catalog.getdatabaseencoding())),
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
    IF (key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255) IS NOT TRUE
       OR response_code IS NULL
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        IF response_code IS NULL THEN
            PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
        END IF;
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF ttl IS NOT NULL OR headers IS NOT NULL THEN
        IF ttl IS NOT NULL THEN
            PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), ttl, 'ttl');
        END IF;
        IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
            RAISE EXCEPTION 'argument "headers" must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'SELECT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'INSERT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'UPDATE') THEN
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
    IF (key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255) IS NOT TRUE
       OR response_code IS NULL OR retryable IS NULL
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
        PERFORM @extschema@.idem_sql_check_key(key, 'key', NULL);
        PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
        PERFORM @extschema@.idem_sql_not_null(retryable, 'retryable');
        PERFORM @extschema@.idem_sql_check_scope(scope);
    END IF;
    IF ttl IS NOT NULL OR headers IS NOT NULL THEN
        IF ttl IS NOT NULL THEN
            PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), ttl, 'ttl');
        END IF;
        IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
            RAISE EXCEPTION 'argument "headers" must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'SELECT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'INSERT')
       OR NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'UPDATE') THEN
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
    IF (key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255
        AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255) IS NOT TRUE
       OR pg_catalog.current_setting('idempotency.max_key_length', true) OPERATOR(pg_catalog.<>) '' THEN
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
-- checked set-wise before any key is read; the keys then go to the same rules as idem_claim.
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
    fps      bytea[];
    e        record;
    res      @extschema@.idem_claim_result;
BEGIN
    PERFORM @extschema@.idem_sql_batch_keys(keys);
    lower_ := coalesce(pg_catalog.array_lower(keys, 1), 1);
    n := coalesce(pg_catalog.cardinality(keys), 0);
    PERFORM @extschema@.idem_sql_check_scope(scope);
    PERFORM @extschema@.idem_sql_per_key(requests, 'requests', n);
    PERFORM @extschema@.idem_sql_per_key(fingerprints, 'fingerprints', n);
    IF fingerprints IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_check_fingerprint(f.fp, (f.i OPERATOR(pg_catalog.+) pg_catalog.array_lower(fingerprints, 1) OPERATOR(pg_catalog.-) 1)::integer)
           FROM pg_catalog.unnest(fingerprints) WITH ORDINALITY AS f(fp, i);
    END IF;
    IF ttl IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), ttl, 'ttl');
    END IF;
    IF lease IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), lease, 'lease');
    END IF;
    deadline := @extschema@.idem_sql_deadline(wait);
    PERFORM @extschema@.idem_sql_not_null(applied, 'applied');
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    PERFORM @extschema@.idem_sql_may('idem_claim_batch()', '{SELECT,INSERT,UPDATE}');
    -- from here on every array is subscripted from 1, element i of each belonging to key i
    keys := ARRAY(SELECT u.x FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    IF requests IS NOT NULL THEN
        requests := ARRAY(SELECT u.x FROM pg_catalog.unnest(requests) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;
    IF fingerprints IS NOT NULL THEN
        fingerprints := ARRAY(SELECT u.x FROM pg_catalog.unnest(fingerprints) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;

    -- each key's fingerprint as idem_claim would store it, then repeats: one key, unless their
    -- fingerprints differ (IK001, naming both elements, before anything is written)
    fps := ARRAY(SELECT coalesce(fingerprints[i],
                        CASE WHEN requests[i] IS NOT NULL
                             THEN @extschema@.idem_sql_fingerprint(scope,
                                      requests[i], true) END)
                   FROM pg_catalog.generate_series(1, n) AS i ORDER BY i);
    FOR e IN
        SELECT d.k, d.first_i, d.next_i FROM (  -- each repeat against the one before it, as C does
            SELECT a.k, pg_catalog.lag(a.i) OVER w AS first_i, a.i AS next_i, pg_catalog.lag(a.fp) OVER w AS first_fp, a.fp AS next_fp
              FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(fps)) WITH ORDINALITY AS a(k, fp, i)
            WINDOW w AS (PARTITION BY (a.k COLLATE pg_catalog."C") ORDER BY a.i)) AS d
         WHERE d.first_i IS NOT NULL AND CASE WHEN d.first_fp IS NULL THEN d.next_fp IS NOT NULL WHEN d.next_fp IS NULL THEN true
                    ELSE NOT d.first_fp OPERATOR(pg_catalog.=) d.next_fp END
         ORDER BY (d.k COLLATE pg_catalog."C"), d.next_i
         LIMIT 1
    LOOP
        RAISE EXCEPTION 'idempotency key "%" appears twice in argument "keys" with different requests', e.k
            USING ERRCODE = 'IK001', COLUMN = e.k,
                  DETAIL = pg_catalog.format('keys[%s] and keys[%s] are the same key.',
                                             lower_ OPERATOR(pg_catalog.+) e.first_i OPERATOR(pg_catalog.-) 1,
                                             lower_ OPERATOR(pg_catalog.+) e.next_i OPERATOR(pg_catalog.-) 1);
    END LOOP;

    FOR e IN
        SELECT DISTINCT ON (a.k COLLATE pg_catalog."C") a.k, a.fp, a.i,
               requests[a.i] AS request
          FROM ROWS FROM (pg_catalog.unnest(keys), pg_catalog.unnest(fps)) WITH ORDINALITY AS a(k, fp, i)
         ORDER BY (a.k COLLATE pg_catalog."C"), a.i
    LOOP
        res := @extschema@.idem_sql_claim_key(scope, e.k, e.fp,
                   CASE WHEN fingerprints IS NULL OR fingerprints[e.i] IS NULL
                        THEN e.request END,
                   ttl, lease, deadline, applied, true);
        key := e.k;
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
DECLARE
    lower_ integer;
    n      integer;
    e      record;
BEGIN
    PERFORM @extschema@.idem_sql_batch_keys(keys);
    lower_ := coalesce(pg_catalog.array_lower(keys, 1), 1);
    n := coalesce(pg_catalog.cardinality(keys), 0);
    PERFORM @extschema@.idem_sql_check_scope(scope);
    PERFORM @extschema@.idem_sql_per_key(attempts, 'attempts', n);
    PERFORM @extschema@.idem_sql_per_key(responses, 'responses', n);
    PERFORM @extschema@.idem_sql_not_null(response_code, 'response_code');
    IF ttl IS NOT NULL THEN
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
    PERFORM @extschema@.idem_sql_may('idem_complete_batch()', '{SELECT,INSERT,UPDATE}');
    IF attempts IS NOT NULL THEN
        attempts := ARRAY(SELECT u.x FROM pg_catalog.unnest(attempts) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;
    IF responses IS NOT NULL THEN
        responses := ARRAY(SELECT u.x FROM pg_catalog.unnest(responses) WITH ORDINALITY AS u(x, i) ORDER BY u.i);
    END IF;
    FOR e IN
        SELECT a.k, a.i FROM pg_catalog.unnest(keys) WITH ORDINALITY AS a(k, i)
         ORDER BY (a.k COLLATE pg_catalog."C")
    LOOP
        PERFORM @extschema@.idem_sql_finish_key(scope, e.k, 'succeeded',
            responses[e.i], response_code, NULL, attempts[e.i], ttl, NULL, NULL, true);
    END LOOP;
    RETURN n;
END
$fn$;
