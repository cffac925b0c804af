-- The SQL edition's internal functions: argument checks, settings, the fingerprint, and the key's
-- rules (docs/contract.md §2, §9), each in one place; the entry points (30-api.sql) call them.
-- Every name is schema-qualified, operators included (OPERATOR(pg_catalog.=)): the functions run
-- with the caller's search_path and must not pick up a look-alike from it, and a SET clause per
-- function would cost every call. Named idem_sql_*: not part of the contract.

-- A setting of the idempotency.* family, as an integer in its unit. Without the C library these
-- are placeholder settings: unset means the C edition's default, and the value is checked here,
-- at use, with the C edition's range (docs/editions.md).
CREATE FUNCTION @extschema@.idem_sql_setting(name text, default_value integer, min_value integer,
                                             max_value integer, unit text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    raw   text := pg_catalog.current_setting(name, true);
    value numeric;
BEGIN
    IF raw IS NULL OR raw OPERATOR(pg_catalog.=) '' THEN
        RETURN default_value;
    END IF;
    IF raw OPERATOR(pg_catalog.~) '^\s*[0-9]{1,12}\s*$' THEN
        value := raw::numeric;
    ELSIF unit IS NOT NULL AND raw OPERATOR(pg_catalog.~) '^\s*[0-9.]+\s*(ms|s|min|h|d)\s*$' THEN
        -- a time with a unit, as the C edition's settings take it ('1d', '90s', '500ms')
        value := pg_catalog.round(EXTRACT(epoch FROM raw::interval)
                     OPERATOR(pg_catalog.*) CASE WHEN unit OPERATOR(pg_catalog.=) 'ms' THEN 1000 ELSE 1 END);
    END IF;
    IF value IS NULL OR value OPERATOR(pg_catalog.<) min_value
       OR value OPERATOR(pg_catalog.>) max_value THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = pg_catalog.format('Valid values are %s to %s%s.', min_value, max_value,
                                           CASE WHEN unit IS NULL THEN '' ELSE ' ' OPERATOR(pg_catalog.||) unit END);
    END IF;
    RETURN value::integer;
END
$fn$;

-- docs/contract.md §4 for one key: argument `arg`, or its element `element` (a batch).
-- The longest key is idempotency.max_key_length, which here only lowers the limit: any role can
-- set a placeholder, so a value above the default is not trusted (docs/editions.md).
CREATE FUNCTION @extschema@.idem_sql_check_key(key text, arg text, element integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    what  text := CASE WHEN element IS NULL THEN pg_catalog.format('argument "%s"', arg)
                       ELSE pg_catalog.format('element %s of argument "%s"', element, arg) END;
    bytes bytea;
    limit_ integer;
    len   integer;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF key OPERATOR(pg_catalog.~) '[^ -~]' THEN
        bytes := pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding());
        FOR i IN 0 .. pg_catalog.length(bytes) OPERATOR(pg_catalog.-) 1 LOOP
            IF pg_catalog.get_byte(bytes, i) OPERATOR(pg_catalog.<) 32
               OR pg_catalog.get_byte(bytes, i) OPERATOR(pg_catalog.>) 126 THEN
                RAISE EXCEPTION '% must contain only printable ASCII characters', what
                    USING ERRCODE = 'invalid_parameter_value',
                          DETAIL = pg_catalog.format('Byte %s is 0x%s.', i OPERATOR(pg_catalog.+) 1,
                              pg_catalog.upper(pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.get_byte(bytes, i)), 2, '0')));
            END IF;
        END LOOP;
    END IF;
    limit_ := least(255, @extschema@.idem_sql_setting('idempotency.max_key_length', 255, 1, 2000, NULL));
    len := pg_catalog.octet_length(key);
    IF len OPERATOR(pg_catalog.<) 1 OR len OPERATOR(pg_catalog.>) limit_ THEN
        RAISE EXCEPTION '% must be 1 to % characters long', what, limit_
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('It is %s characters long.', len);
    END IF;
END
$fn$;

CREATE FUNCTION @extschema@.idem_sql_check_scope(scope text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF scope IS NULL THEN
        RAISE EXCEPTION 'argument "scope" must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'argument "scope" must be at most 255 bytes long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('It is %s bytes long.', pg_catalog.octet_length(scope));
    END IF;
END
$fn$;

CREATE FUNCTION @extschema@.idem_sql_not_null(value anyelement, arg text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', arg USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$fn$;

-- The usual key and scope (docs/contract.md §4) as one test, in SQL so that the planner inlines
-- it into the caller's expression (as idem_sql_end_ok): a key of 1 to 255 printable ASCII
-- characters (one byte each) is one regular expression, a scope at most 255 bytes, and no
-- idempotency.max_key_length set (never set is NULL, and IS NULL names no function). Not true:
-- the caller runs the checks that name what is wrong.
CREATE FUNCTION @extschema@.idem_sql_usual_key(key text, scope text)
RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
SELECT key OPERATOR(pg_catalog.~) '^[ -~]+$' AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255
       AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255
       AND pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL
$fn$;

-- Whether the transaction can write and the caller has SELECT, INSERT and UPDATE on idem_keys
-- (§7), inlined as idem_sql_usual_key; not true: idem_sql_may says which is missing.
CREATE FUNCTION @extschema@.idem_sql_may_write()
RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
SELECT pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.<>) 'on'
       AND pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'SELECT')
       AND pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'INSERT')
       AND pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, 'UPDATE')
$fn$;

-- from + interval, which must be after `from` and at most 100 calendar years later (22023 naming
-- the argument). The interval comparison first keeps the addition from overflowing.
CREATE FUNCTION @extschema@.idem_sql_duration_end(from_ timestamptz, duration interval, arg text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    end_ timestamptz;
BEGIN
    IF duration OPERATOR(pg_catalog.>) '0'::interval
       AND duration OPERATOR(pg_catalog.<=) '100 years'::interval THEN
        end_ := from_ OPERATOR(pg_catalog.+) duration;
        IF end_ OPERATOR(pg_catalog.>) from_
           AND end_ OPERATOR(pg_catalog.<=) (from_ OPERATOR(pg_catalog.+) '100 years'::interval) THEN
            RETURN end_;
        END IF;
    END IF;
    RAISE EXCEPTION 'argument "%" must be a positive interval of at most 100 years', arg
        USING ERRCODE = 'invalid_parameter_value';
END
$fn$;

-- Whether from_ + duration is a valid end (the checks above, without raising), in SQL so that
-- the planner inlines it into the caller's expression: the common case then calls no function
-- of ours (each such call costs a claim as much as several checks), and the caller raises
-- through idem_sql_duration_end only when it is false.
CREATE FUNCTION @extschema@.idem_sql_end_ok(from_ timestamptz, duration interval)
RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
SELECT duration OPERATOR(pg_catalog.>) '0'::interval
       AND duration OPERATOR(pg_catalog.<=) '100 years'::interval
       AND (from_ OPERATOR(pg_catalog.+) duration) OPERATOR(pg_catalog.>) from_
       AND (from_ OPERATOR(pg_catalog.+) duration)
           OPERATOR(pg_catalog.<=) (from_ OPERATOR(pg_catalog.+) '100 years'::interval)
$fn$;

-- The arguments only idem_complete and idem_fail take, when given: ttl (as idem_sql_duration_end
-- checks it) and headers (a JSON object).
CREATE FUNCTION @extschema@.idem_sql_check_finish(ttl interval, headers jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF ttl IS NOT NULL THEN
        PERFORM @extschema@.idem_sql_duration_end(pg_catalog.clock_timestamp(), ttl, 'ttl');
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'argument "headers" must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- docs/contract.md §9.3: from 0 to 1 hour, on the calendar like the other intervals. Returns the
-- call's deadline.
CREATE FUNCTION @extschema@.idem_sql_deadline(wait interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    end_ timestamptz;
BEGIN
    IF wait IS NULL THEN
        RETURN NULL;
    END IF;
    IF wait OPERATOR(pg_catalog.>=) '0'::interval AND wait OPERATOR(pg_catalog.<=) '1 hour'::interval THEN
        end_ := now_ OPERATOR(pg_catalog.+) wait;
        IF end_ OPERATOR(pg_catalog.>=) now_
           AND end_ OPERATOR(pg_catalog.<=) (now_ OPERATOR(pg_catalog.+) '1 hour'::interval) THEN
            RETURN end_;
        END IF;
    END IF;
    RAISE EXCEPTION 'argument "wait" must be an interval from 0 to 1 hour'
        USING ERRCODE = 'invalid_parameter_value';
END
$fn$;

CREATE FUNCTION @extschema@.idem_sql_check_fingerprint(fingerprint bytea, element integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF fingerprint IS NOT NULL AND (pg_catalog.length(fingerprint) OPERATOR(pg_catalog.<) 1
                                    OR pg_catalog.length(fingerprint) OPERATOR(pg_catalog.>) 64) THEN
        RAISE EXCEPTION '% must be 1 to 64 bytes long',
              CASE WHEN element IS NULL THEN 'argument "fingerprint"'
                   ELSE pg_catalog.format('element %s of argument "fingerprints"', element) END
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('It is %s bytes long.', pg_catalog.length(fingerprint));
    END IF;
END
$fn$;

-- What every function that reads or writes keys checks after its arguments and before it reads
-- a key (docs/contract.md §2): that the transaction can write (unless SELECT is all it needs),
-- then the privileges on idem_keys (table-level, as the C edition checks them, with PostgreSQL's
-- own message and the C edition's HINT naming the GRANT that fixes it, docs/security.md).
CREATE FUNCTION @extschema@.idem_sql_may(caller text, privileges text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    p      text;
    table_ text;
BEGIN
    IF privileges OPERATOR(pg_catalog.<>) '{SELECT}'::text[]
       AND pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
        RAISE EXCEPTION 'cannot execute % in a read-only transaction', caller
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    FOREACH p IN ARRAY privileges LOOP
        IF NOT pg_catalog.has_table_privilege('@extschema@.idem_keys'::pg_catalog.regclass, p) THEN
            SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO table_
              FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
             WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass;
            RAISE EXCEPTION 'permission denied for table idem_keys'
                USING ERRCODE = 'insufficient_privilege',
                      HINT = pg_catalog.format('%s needs %s on %s: GRANT %s ON %s TO %I (or to a role it inherits from; docs/security.md, "Granting access").',
                                               caller, pg_catalog.array_to_string(privileges, ', '), table_,
                                               pg_catalog.array_to_string(privileges, ', '), table_,
                                               CURRENT_USER);
        END IF;
    END LOOP;
END
$fn$;

-- docs/contract.md §3 and §9.6: jsonb's own text form with every number written with the fewest
-- fraction digits that keep its value. Built piece by piece only for a request that may hold such
-- a number; otherwise jsonb's text is already canonical.
CREATE FUNCTION @extschema@.idem_sql_canonical(request jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
DECLARE
    kind text := pg_catalog.jsonb_typeof(request);
    number text;
BEGIN
    IF kind OPERATOR(pg_catalog.=) 'object' THEN
        RETURN '{' OPERATOR(pg_catalog.||) coalesce((
            SELECT pg_catalog.string_agg(pg_catalog.to_jsonb(e.key)::text OPERATOR(pg_catalog.||) ': '
                                         OPERATOR(pg_catalog.||) @extschema@.idem_sql_canonical(e.value),
                                         ', ' ORDER BY e.n)
              FROM pg_catalog.jsonb_each(request) WITH ORDINALITY AS e(key, value, n)), '')
            OPERATOR(pg_catalog.||) '}';
    ELSIF kind OPERATOR(pg_catalog.=) 'array' THEN
        RETURN '[' OPERATOR(pg_catalog.||) coalesce((
            SELECT pg_catalog.string_agg(@extschema@.idem_sql_canonical(e.value), ', ' ORDER BY e.n)
              FROM pg_catalog.jsonb_array_elements(request) WITH ORDINALITY AS e(value, n)), '')
            OPERATOR(pg_catalog.||) ']';
    ELSIF kind OPERATOR(pg_catalog.=) 'number' THEN
        number := request::text;
        -- numeric's text never has an exponent: trailing fraction zeros are all there is to drop
        IF number OPERATOR(pg_catalog.~) '\.[0-9]*0$' THEN
            number := pg_catalog.trim_scale(request::numeric)::text;
        END IF;
        RETURN number;
    END IF;
    RETURN request::text;
END
$fn$;

-- The request fingerprint (docs/contract.md §3): SHA-256 of the scope's bytes, 0x00, and the
-- canonical text, in the database's encoding, as the C edition hashes them. `trim`: false gives
-- 1.1's fingerprint (numbers as written), which a key stored by 1.1 holds (§9.6).
CREATE FUNCTION @extschema@.idem_sql_fingerprint(scope text, request jsonb, trim_numbers boolean)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
DECLARE
    canonical text := request::text;
    encoding  name := pg_catalog.getdatabaseencoding();
BEGIN
    -- a match may also be a string's content: then the exact form is built, to the same effect
    IF trim_numbers AND canonical OPERATOR(pg_catalog.~) '\.[0-9]*0([^0-9]|$)' THEN
        canonical := @extschema@.idem_sql_canonical(request);
    END IF;
    RETURN pg_catalog.sha256(pg_catalog.convert_to(scope, encoding) OPERATOR(pg_catalog.||) '\x00'::bytea
                             OPERATOR(pg_catalog.||) pg_catalog.convert_to(canonical, encoding));
END
$fn$;

-- The status of a transaction id read from a row (xmin, xmax): 'in progress', 'committed',
-- 'aborted', or NULL when unknown (too old). Its epoch is the one that puts it closest to this
-- transaction's own id (or the snapshot's horizon). An id the snapshot counts as not yet completed
-- is 'in progress' without a look at the commit log (it may also be a multixact's id: then a
-- needless wait at worst).
CREATE FUNCTION @extschema@.idem_sql_xact_status(x xid)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    horizon bigint := pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint;
    ref     bigint := coalesce(pg_catalog.pg_current_xact_id_if_assigned()::text::bigint, horizon);
    full_   bigint := (ref OPERATOR(pg_catalog./) 4294967296) OPERATOR(pg_catalog.*) 4294967296
                      OPERATOR(pg_catalog.+) x::text::bigint;
BEGIN
    IF full_ OPERATOR(pg_catalog.>) (ref OPERATOR(pg_catalog.+) 2147483648) THEN
        full_ := full_ OPERATOR(pg_catalog.-) 4294967296;
    ELSIF full_ OPERATOR(pg_catalog.<) (ref OPERATOR(pg_catalog.-) 2147483648) THEN
        full_ := full_ OPERATOR(pg_catalog.+) 4294967296;
    END IF;
    IF full_ OPERATOR(pg_catalog.>=) horizon THEN
        RETURN 'in progress';
    END IF;
    IF full_ OPERATOR(pg_catalog.<) 3 THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.pg_xact_status(full_::text::xid8);
END
$fn$;

-- Sets lock_timeout to what is left until a `wait` deadline (at least 1 ms: 0 would mean no
-- limit); returns the setting it replaced. Called inside a block that catches lock_not_available.
CREATE FUNCTION @extschema@.idem_sql_lock_until(deadline timestamptz)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    before text := pg_catalog.current_setting('lock_timeout');
    ms     numeric := pg_catalog.ceil(EXTRACT(epoch FROM deadline OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())
                                      OPERATOR(pg_catalog.*) 1000);
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout',
        greatest(ms, 1)::bigint::text OPERATOR(pg_catalog.||) 'ms', true);
    RETURN before;
END
$fn$;

-- docs/contract.md §2 (idem_claim) and §9: the claim of one key, for idem_claim and
-- idem_claim_batch. `fingerprint` is what the claim stores (the caller's, or the request's);
-- `request`, when given, for keys stored by 1.1 (§9.6); `deadline` the end of `wait` (NULL: none);
-- `in_batch`: errors about the key carry it as their column name (§11).
--
-- The key's latest committed version decides; a version another transaction is writing is waited
-- for by a share lock taken in a subtransaction that is then rolled back (so nothing stays
-- locked), and writes wait as INSERT ... ON CONFLICT and UPDATE do. A write is made only to the
-- version that was decided on (same xmin), else the claim decides again on the new one.
-- Look first or insert first (docs/editions.md): INSERT ... ON CONFLICT DO NOTHING looks before
-- it inserts, so inserting first costs a new key one statement instead of two, and an existing
-- key an insertion attempt more than a look. As the C edition does, a claim inserts first after
-- a claim of this session that created its key (the placeholder setting idem_sql.insert_first,
-- a hint only: either way gives the same answer), never with `wait` (lock_timeout would bound the
-- insertion's wait) or under a transaction snapshot.
-- The insertion is written twice, without and with `wait`: only the second needs the block that
-- catches lock_not_available, and entering such a block starts a subtransaction on every call.
CREATE FUNCTION @extschema@.idem_sql_claim_key(
    scope_ text, key_ text, fingerprint_ bytea, request_ jsonb, ttl_ interval, lease_ interval,
    deadline timestamptz, applied_ boolean, in_batch boolean)
RETURNS @extschema@.idem_claim_result
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    r        @extschema@.idem_keys;
    seen     record;
    row_xmin xid;
    row_xmax xid;
    now_     timestamptz;
    own      boolean;
    expired  boolean;
    mismatch boolean;
    status   text;
    probed   boolean;  -- NULL: false (an initial value is an expression on every call)
    hidden   integer;
    before   text;
    done     boolean;
    seconds  numeric;
    exists_  boolean;
    expires  timestamptz;
    until_   timestamptz;
    look     boolean := coalesce(pg_catalog.current_setting('idem_sql.insert_first', true), '') OPERATOR(pg_catalog.<>) 'on'
                        OR deadline IS NOT NULL
                        OR pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed';
BEGIN
    LOOP
        IF look THEN
            SELECT k AS row_, k.xmin AS xmin_, k.xmax AS xmax_ INTO seen
              FROM @extschema@.idem_keys AS k
             WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_;
            exists_ := FOUND;
        END IF;
        now_ := pg_catalog.clock_timestamp();

        IF exists_ THEN
            r := seen.row_;
            row_xmin := seen.xmin_;
            row_xmax := seen.xmax_;
            -- (statements apart, here and below: a function of ours in an expression costs every
            -- claim its look-up, taken or not)
            own := false;
            IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL THEN
                own := coalesce(@extschema@.idem_sql_xact_status(row_xmin) OPERATOR(pg_catalog.=) 'in progress', false);
            END IF;
            IF NOT own AND probed IS NOT TRUE AND NOT row_xmax OPERATOR(pg_catalog.=) '0'::xid THEN
                -- Someone may be writing this version (§2 step 2), or, at REPEATABLE READ, may have
                -- replaced it after the snapshot: a share lock waits for the writer, or raises 40001.
                status := @extschema@.idem_sql_xact_status(row_xmax);
                IF status IS NULL OR status OPERATOR(pg_catalog.=) 'in progress'
                   OR (status OPERATOR(pg_catalog.=) 'committed'
                       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed') THEN
                    BEGIN
                        IF deadline IS NOT NULL AND deadline OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() THEN
                            -- `wait` is over (or 0): never block
                            PERFORM FROM @extschema@.idem_keys AS k
                              WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
                                FOR SHARE NOWAIT;
                        ELSE
                            IF deadline IS NOT NULL THEN
                                PERFORM @extschema@.idem_sql_lock_until(deadline);
                            END IF;
                            PERFORM FROM @extschema@.idem_keys AS k
                              WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
                                FOR SHARE;
                        END IF;
                        -- undo the lock (and the setting): the look is all that was wanted
                        RAISE SQLSTATE 'IKW00';
                    EXCEPTION
                        WHEN SQLSTATE 'IKW00' THEN
                            NULL;
                        WHEN lock_not_available THEN
                            IF deadline IS NULL THEN
                                RAISE;
                            END IF;
                            RETURN ROW('in_progress', false, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL)::@extschema@.idem_claim_result;  -- nothing seen
                    END;
                    probed := true;
                    CONTINUE;
                END IF;
            END IF;

            -- §9.1: an expired key is a new key (a different request is no mismatch); this
            -- transaction's own row is its own, whatever the clock says.
            expired := NOT own AND r.expires_at OPERATOR(pg_catalog.<=) now_
                       AND NOT (r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                                AND r.locked_until OPERATOR(pg_catalog.>) now_);
            IF NOT expired THEN
                -- §2 step 3, §9.6 (a key stored by 1.1 has the fingerprint of the untrimmed text)
                mismatch := CASE WHEN r.fingerprint IS NULL THEN fingerprint_ IS NOT NULL
                                 WHEN fingerprint_ IS NULL THEN true
                                 ELSE NOT r.fingerprint OPERATOR(pg_catalog.=) fingerprint_ END;
                IF mismatch AND r.fingerprint IS NOT NULL AND fingerprint_ IS NOT NULL AND request_ IS NOT NULL THEN
                    mismatch := NOT r.fingerprint OPERATOR(pg_catalog.=) @extschema@.idem_sql_fingerprint(scope_, request_, false);
                END IF;
                IF mismatch THEN
                    IF in_batch THEN
                        RAISE EXCEPTION 'idempotency key "%" was already used with a different request', key_
                            USING ERRCODE = 'IK001', HINT = 'Use a new idempotency key for a different request.',
                                  COLUMN = key_;
                    END IF;
                    RAISE EXCEPTION 'idempotency key "%" was already used with a different request', key_
                        USING ERRCODE = 'IK001', HINT = 'Use a new idempotency key for a different request.';
                END IF;
                -- step 4: a re-entrant claim answers what this transaction wrote
                IF own THEN
                    RETURN ROW(CASE WHEN r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                                    THEN 'claimed' ELSE 'replay' END,
                               false, r.attempt, r.state, r.response, r.response_code, NULL, r.expires_at,
                               NULL, r.response_body, r.response_headers)::@extschema@.idem_claim_result;
                END IF;
                -- step 5
                IF r.state OPERATOR(pg_catalog.=) 'succeeded'::@extschema@.idem_state
                   OR (r.state OPERATOR(pg_catalog.=) 'failed'::@extschema@.idem_state
                       AND NOT coalesce(r.retryable, false)) THEN
                    RETURN ROW('replay', false, r.attempt, r.state, r.response, r.response_code, NULL,
                               r.expires_at, NULL, r.response_body, r.response_headers)::@extschema@.idem_claim_result;
                END IF;
                -- step 6: a live lease. With `wait` and no shared memory to be woken through, only a
                -- lease that ends before the deadline is waited for (§9.3), then the key looked at again.
                IF r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                   AND r.locked_until OPERATOR(pg_catalog.>) now_ THEN
                    IF deadline IS NOT NULL AND now_ OPERATOR(pg_catalog.<) deadline
                       AND r.locked_until OPERATOR(pg_catalog.<=) deadline THEN
                        PERFORM pg_catalog.pg_sleep(greatest(0.001,
                            pg_catalog.ceil(EXTRACT(epoch FROM r.locked_until OPERATOR(pg_catalog.-) now_)
                                            OPERATOR(pg_catalog.*) 1000) OPERATOR(pg_catalog./) 1000));
                        probed := false;
                        CONTINUE;
                    END IF;
                    seconds := pg_catalog.ceil(EXTRACT(epoch FROM r.locked_until OPERATOR(pg_catalog.-) now_));
                    RETURN ROW('in_progress', false, r.attempt, r.state, r.response, r.response_code,
                               r.locked_until OPERATOR(pg_catalog.-) now_, r.expires_at,
                               least(greatest(seconds, 1), 2147483647)::integer,
                               r.response_body, r.response_headers)::@extschema@.idem_claim_result;
                END IF;
                -- step 7: takeover of an ended lease or a retryable failure
                IF r.attempt OPERATOR(pg_catalog.=) 2147483647 THEN
                    IF in_batch THEN
                        RAISE EXCEPTION 'idempotency key "%" has been taken over too many times', key_
                            USING ERRCODE = 'numeric_value_out_of_range', COLUMN = key_;
                    END IF;
                    RAISE EXCEPTION 'idempotency key "%" has been taken over too many times', key_
                        USING ERRCODE = 'numeric_value_out_of_range';
                END IF;
            ELSE
                -- §9.1: claimed anew in place, as a new key
                r.fingerprint := fingerprint_;
                r.created_at := now_;
            END IF;
        END IF;

        -- The write's ends at now_ (§9): an argument's, else the setting's default. The callers
        -- have checked the arguments (idem_sql_duration_end), so a sum cannot overflow; its
        -- calendar check is made again at this now_, the error raised as that function raises
        -- it. Statements, not one expression, so that a claim compiles no call of the rare paths.
        -- A setting never set is NULL; one set at all (even to '') is read by idem_sql_setting.
        IF ttl_ IS NULL
           AND pg_catalog.current_setting('idempotency.default_ttl', true) IS NULL THEN
            expires := now_ OPERATOR(pg_catalog.+) '86400 seconds'::interval;
        ELSIF ttl_ IS NULL THEN
            expires := now_ OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
                           @extschema@.idem_sql_setting('idempotency.default_ttl', 86400, 1, 2147483647, 's'));
        ELSE
            expires := now_ OPERATOR(pg_catalog.+) ttl_;
            IF NOT (expires OPERATOR(pg_catalog.>) now_
                    AND expires OPERATOR(pg_catalog.<=) (now_ OPERATOR(pg_catalog.+) '100 years'::interval)) THEN
                expires := @extschema@.idem_sql_duration_end(now_, ttl_, 'ttl');
            END IF;
        END IF;
        IF applied_ THEN
            until_ := NULL;
        ELSIF lease_ IS NULL THEN
            IF pg_catalog.current_setting('idempotency.default_lease', true) IS NULL THEN
                until_ := now_ OPERATOR(pg_catalog.+) '60 seconds'::interval;
            ELSE
                until_ := now_ OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
                              @extschema@.idem_sql_setting('idempotency.default_lease', 60000, 1, 2147483647, 'ms')
                              OPERATOR(pg_catalog./) 1000.0);
            END IF;
        ELSE
            until_ := now_ OPERATOR(pg_catalog.+) lease_;
            IF NOT (until_ OPERATOR(pg_catalog.>) now_
                    AND until_ OPERATOR(pg_catalog.<=) (now_ OPERATOR(pg_catalog.+) '100 years'::interval)) THEN
                until_ := @extschema@.idem_sql_duration_end(now_, lease_, 'lease');
            END IF;
        END IF;

        IF exists_ IS NOT TRUE THEN
            -- §2 step 1: a new key. A concurrent insert of it is waited for by the insert itself.
            IF deadline IS NULL THEN
                INSERT INTO @extschema@.idem_keys AS k
                       (scope, key, state, attempt, fingerprint, created_at, expires_at, locked_until,
                        completed_at, claimed_at)
                VALUES (scope_, key_, CASE WHEN applied_ THEN 'succeeded'::@extschema@.idem_state ELSE 'pending'::@extschema@.idem_state END,
                        1, fingerprint_, now_, expires, until_,
                        CASE WHEN applied_ THEN now_ END, now_)
                ON CONFLICT DO NOTHING
                RETURNING k.attempt, k.state, k.expires_at INTO r.attempt, r.state, r.expires_at;
                done := FOUND;
            ELSE
                BEGIN
                    before := @extschema@.idem_sql_lock_until(deadline);
                    INSERT INTO @extschema@.idem_keys AS k
                           (scope, key, state, attempt, fingerprint, created_at, expires_at, locked_until,
                            completed_at, claimed_at)
                    VALUES (scope_, key_, CASE WHEN applied_ THEN 'succeeded'::@extschema@.idem_state ELSE 'pending'::@extschema@.idem_state END,
                            1, fingerprint_, now_, expires, until_,
                            CASE WHEN applied_ THEN now_ END, now_)
                    ON CONFLICT DO NOTHING
                    RETURNING k.attempt, k.state, k.expires_at INTO r.attempt, r.state, r.expires_at;
                    done := FOUND;
                    PERFORM pg_catalog.set_config('lock_timeout', before, true);
                EXCEPTION WHEN lock_not_available THEN
                    RETURN ROW('in_progress', false, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL)::@extschema@.idem_claim_result;  -- nothing seen
                END;
            END IF;
            IF done THEN
                IF look THEN  -- (nested: an insert-first claim never sets the rest up)
                    IF deadline IS NULL  -- a new key: the next claims of this session insert first
                       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
                        PERFORM pg_catalog.set_config('idem_sql.insert_first', 'on', false);
                    END IF;
                END IF;
                RETURN ROW('claimed', true, r.attempt, r.state, NULL, NULL, NULL, r.expires_at,
                           NULL, NULL, NULL)::@extschema@.idem_claim_result;
            END IF;
            -- it exists (committed, or this transaction's), or row-level security hides it from
            -- this role (then the look finds nothing, again and again)
            IF look THEN
                hidden := coalesce(hidden, 0) OPERATOR(pg_catalog.+) 1;
                IF hidden OPERATOR(pg_catalog.>) 3 THEN
                    RAISE EXCEPTION 'idempotency key "%" exists but row-level security hides it from this role', key_
                        USING ERRCODE = 'insufficient_privilege';
                END IF;
            ELSE  -- a key that exists: the next claims of this session look first
                PERFORM pg_catalog.set_config('idem_sql.insert_first', 'off', false);
                look := true;
            END IF;
            CONTINUE;
        ELSE
            -- step 7, or §9.1: the key taken over, or claimed anew in place
            r.attempt := CASE WHEN expired THEN 1 ELSE r.attempt OPERATOR(pg_catalog.+) 1 END;
            r.expires_at := CASE WHEN expired THEN expires ELSE greatest(r.expires_at, expires) END;
            r.state := CASE WHEN applied_ THEN 'succeeded' ELSE 'pending' END;
            r.response := NULL;
            r.response_code := NULL;
            r.response_body := NULL;
            r.response_headers := NULL;
            r.retryable := NULL;
            r.claimed_at := now_;
            r.completed_at := CASE WHEN applied_ THEN now_ END;
            r.locked_until := until_;
            BEGIN
                IF deadline IS NOT NULL THEN
                    before := @extschema@.idem_sql_lock_until(deadline);
                END IF;
                UPDATE @extschema@.idem_keys AS k
                   SET state = r.state, attempt = r.attempt, fingerprint = r.fingerprint,
                       response = NULL, response_code = NULL, retryable = NULL,
                       created_at = r.created_at, locked_until = r.locked_until,
                       completed_at = r.completed_at, expires_at = r.expires_at,
                       response_body = NULL, response_headers = NULL, claimed_at = r.claimed_at
                 WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
                   AND k.xmin OPERATOR(pg_catalog.=) row_xmin
                RETURNING k.* INTO r;
                done := FOUND;
                IF deadline IS NOT NULL THEN
                    PERFORM pg_catalog.set_config('lock_timeout', before, true);
                END IF;
            EXCEPTION WHEN lock_not_available THEN
                IF deadline IS NULL THEN
                    RAISE;
                END IF;
                RETURN ROW('in_progress', false, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL, NULL)::@extschema@.idem_claim_result;  -- nothing seen
            END;
            IF done THEN
                RETURN ROW('claimed', expired, r.attempt, r.state, NULL, NULL, NULL, r.expires_at,
                           NULL, NULL, NULL)::@extschema@.idem_claim_result;
            END IF;
            -- changed since it was read: decide again on the new version
            probed := false;
        END IF;
    END LOOP;
END
$fn$;

-- The owner's calls (complete, fail, extend, release) on a key whose conditional write found
-- nothing to change: the reason, in the contract's order (IK003, then IK002 before IK004), or
-- nothing if the key's current version would now qualify (the caller then tries again).
-- The conditional write skips a committed version that does not qualify without waiting for a
-- transaction that is writing it; locking the row waits for that writer and decides on its
-- result (docs/contract.md §2), as the C edition does.
CREATE FUNCTION @extschema@.idem_sql_owner_refusal(scope_ text, key_ text, attempt_ integer,
                                                   in_batch boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    r    @extschema@.idem_keys;
    now_ timestamptz;
BEGIN
    LOOP
        SELECT k.* INTO r FROM @extschema@.idem_keys AS k
         WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
           FOR NO KEY UPDATE;
        EXIT WHEN FOUND;
        -- deleted by the writer waited for: absent, unless written anew meanwhile
        EXIT WHEN NOT EXISTS (SELECT FROM @extschema@.idem_keys AS k
                               WHERE k.scope OPERATOR(pg_catalog.=) scope_
                                 AND k.key OPERATOR(pg_catalog.=) key_);
    END LOOP;
    now_ := pg_catalog.clock_timestamp();
    IF r.key IS NULL OR (r.expires_at OPERATOR(pg_catalog.<=) now_
                     AND NOT (r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
                              AND r.locked_until OPERATOR(pg_catalog.>) now_)) THEN
        IF in_batch THEN
            RAISE EXCEPTION 'idempotency key "%" does not exist', key_
                USING ERRCODE = 'IK003', COLUMN = key_;
        END IF;
        RAISE EXCEPTION 'idempotency key "%" does not exist', key_ USING ERRCODE = 'IK003';
    END IF;
    IF attempt_ IS NOT NULL AND NOT attempt_ OPERATOR(pg_catalog.=) r.attempt THEN
        IF in_batch THEN
            RAISE EXCEPTION 'attempt % of idempotency key "%" is stale', attempt_, key_
                USING ERRCODE = 'IK002', COLUMN = key_,
                      DETAIL = CASE WHEN r.attempt OPERATOR(pg_catalog.>) 1
                                    THEN pg_catalog.format('The key was taken over; its current attempt is %s.', r.attempt)
                                    ELSE pg_catalog.format('The key has not been taken over; its current attempt is %s.', r.attempt) END;
        END IF;
        RAISE EXCEPTION 'attempt % of idempotency key "%" is stale', attempt_, key_
            USING ERRCODE = 'IK002',
                  DETAIL = CASE WHEN r.attempt OPERATOR(pg_catalog.>) 1
                                THEN pg_catalog.format('The key was taken over; its current attempt is %s.', r.attempt)
                                ELSE pg_catalog.format('The key has not been taken over; its current attempt is %s.', r.attempt) END;
    END IF;
    IF NOT r.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state THEN
        IF in_batch THEN
            RAISE EXCEPTION 'idempotency key "%" is not pending', key_
                USING ERRCODE = 'IK004', COLUMN = key_,
                      DETAIL = pg_catalog.format('The key is already finished; its state is %s.', r.state);
        END IF;
        RAISE EXCEPTION 'idempotency key "%" is not pending', key_
            USING ERRCODE = 'IK004',
                  DETAIL = pg_catalog.format('The key is already finished; its state is %s.', r.state);
    END IF;
END
$fn$;

-- docs/contract.md §2 (idem_complete, idem_fail) and §9.2: finishes one pending key, as UPDATE
-- finds it at READ COMMITTED (a concurrent writer is waited for, then its version decides).
CREATE FUNCTION @extschema@.idem_sql_finish_key(
    scope_ text, key_ text, state_ @extschema@.idem_state, response_ jsonb, response_code_ integer,
    retryable_ boolean, attempt_ integer, ttl_ interval, body_ bytea, headers_ jsonb,
    in_batch boolean)
RETURNS @extschema@.idem_keys
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    r    @extschema@.idem_keys;
    now_ timestamptz;
    expires timestamptz;
BEGIN
    LOOP
        now_ := pg_catalog.clock_timestamp();
        IF ttl_ IS NOT NULL THEN  -- a statement apart: a function of ours costs its look-up
            expires := @extschema@.idem_sql_duration_end(now_, ttl_, 'ttl');
        END IF;
        UPDATE @extschema@.idem_keys AS k
           SET state = state_, response = response_, response_code = response_code_,
               response_body = body_, response_headers = headers_,
               retryable = CASE WHEN state_ OPERATOR(pg_catalog.=) 'failed'::@extschema@.idem_state
                                THEN retryable_ END,
               completed_at = now_, locked_until = NULL,
               expires_at = coalesce(expires, k.expires_at)
         WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
           AND k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
           AND (attempt_ IS NULL OR k.attempt OPERATOR(pg_catalog.=) attempt_)
           AND (k.expires_at OPERATOR(pg_catalog.>) now_ OR k.locked_until OPERATOR(pg_catalog.>) now_)
        RETURNING k.* INTO r;
        IF FOUND THEN
            RETURN r;
        END IF;
        PERFORM @extschema@.idem_sql_owner_refusal(scope_, key_, attempt_, in_batch);
    END LOOP;
END
$fn$;

-- docs/contract.md §9.4: the owner's new lease end (extend), or now (release: lease_ NULL).
CREATE FUNCTION @extschema@.idem_sql_lease_key(scope_ text, key_ text, attempt_ integer,
                                               lease_ interval)
RETURNS @extschema@.idem_keys
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    r    @extschema@.idem_keys;
    now_ timestamptz;
    until_ timestamptz;
BEGIN
    LOOP
        now_ := pg_catalog.clock_timestamp();
        until_ := CASE WHEN lease_ IS NULL THEN now_
                       ELSE @extschema@.idem_sql_duration_end(now_, lease_, 'lease') END;
        UPDATE @extschema@.idem_keys AS k SET locked_until = until_
         WHERE k.scope OPERATOR(pg_catalog.=) scope_ AND k.key OPERATOR(pg_catalog.=) key_
           AND k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
           AND k.attempt OPERATOR(pg_catalog.=) attempt_
           AND (k.expires_at OPERATOR(pg_catalog.>) now_ OR k.locked_until OPERATOR(pg_catalog.>) now_)
        RETURNING k.* INTO r;
        IF FOUND THEN
            RETURN r;
        END IF;
        PERFORM @extschema@.idem_sql_owner_refusal(scope_, key_, attempt_, false);
    END LOOP;
END
$fn$;

-- docs/contract.md §11: the batch's "keys": not NULL, one-dimensional, every element a key (§4),
-- an error naming the element by its subscript. One statement finds the first element that is not
-- a key as idem_claim's own quick test does; idem_sql_check_key then raises what is wrong with it
-- (and checks every element when idempotency.max_key_length is set).
CREATE FUNCTION @extschema@.idem_sql_batch_keys(keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    lower_ integer := coalesce(pg_catalog.array_lower(keys, 1), 1);
    k      text;
    i      integer := 0;
BEGIN
    PERFORM @extschema@.idem_sql_batch_array(keys, 'keys');
    IF coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '') OPERATOR(pg_catalog.=) '' THEN
        SELECT u.i OPERATOR(pg_catalog.-) 1 INTO i
          FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(k, i)
         WHERE u.k IS NULL OR u.k OPERATOR(pg_catalog.~) '[^ -~]' OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.<) 1
               OR pg_catalog.octet_length(u.k) OPERATOR(pg_catalog.>) 255
         ORDER BY u.i
         LIMIT 1;
        IF FOUND THEN
            PERFORM @extschema@.idem_sql_check_key(keys[lower_ OPERATOR(pg_catalog.+) i], 'keys', lower_ OPERATOR(pg_catalog.+) i);
        END IF;
        RETURN;
    END IF;
    FOREACH k IN ARRAY keys LOOP
        PERFORM @extschema@.idem_sql_check_key(k, 'keys', lower_ OPERATOR(pg_catalog.+) i);
        i := i OPERATOR(pg_catalog.+) 1;
    END LOOP;
END
$fn$;

-- A batch's array argument: not NULL (22004) and not of more than one dimension (22023).
CREATE FUNCTION @extschema@.idem_sql_batch_array(elements anyarray, arg text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF elements IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', arg USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.array_ndims(elements) OPERATOR(pg_catalog.>) 1 THEN
        RAISE EXCEPTION 'argument "%" must be a one-dimensional array', arg
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- An optional per-key array: NULL, or exactly one element per key.
CREATE FUNCTION @extschema@.idem_sql_per_key(elements anyarray, arg text, nkeys integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    IF elements IS NULL THEN
        RETURN;
    END IF;
    PERFORM @extschema@.idem_sql_batch_array(elements, arg);
    IF pg_catalog.cardinality(elements) OPERATOR(pg_catalog.<>) nkeys THEN
        RAISE EXCEPTION 'argument "%" must have one element per key', arg
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('"keys" has %s elements, "%s" has %s.', nkeys, arg,
                                             pg_catalog.cardinality(elements));
    END IF;
END
$fn$;
