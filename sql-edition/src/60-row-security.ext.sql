-- (extension routes only) The record of idem_keys' row-level security (docs/contract.md §13).
-- pg_dump leaves out an extension table's ENABLE ROW LEVEL SECURITY and its policies, but dumps
-- the rows of the extension's configuration tables: these two record what idem_keys has, and
-- their triggers put it back when a restore loads their rows. The tables are the C edition's
-- (same columns), so that the record moves between the editions by dump and restore.
--
-- The C edition keeps the record in step with event triggers, which only a superuser can create;
-- the SQL edition is installed by ordinary roles, so the owner of idem_keys records by calling
-- idem_row_security_record() after changing its row-level security (docs/editions.md).
-- These functions run rarely (by the owner, or by a restore), so each sets search_path to
-- pg_catalog, pg_temp: policy expressions print with every other name schema-qualified, and the
-- DDL they run resolves nothing from the caller's path. Names are qualified all the same.
-- SECURITY INVOKER: writing the record, or idem_keys' policies, needs the privileges of idem_keys'
-- owner, and each function checks them first (42501).
CREATE TABLE @extschema@.idem_row_security (
    single  boolean PRIMARY KEY DEFAULT true CHECK (single),
    enabled boolean NOT NULL,
    forced  boolean NOT NULL
);
CREATE TABLE @extschema@.idem_policies (
    name       text COLLATE pg_catalog."C" PRIMARY KEY,
    permissive boolean NOT NULL,
    command    text NOT NULL CHECK (command IN ('ALL', 'SELECT', 'INSERT', 'UPDATE', 'DELETE')),
    roles      text[] NOT NULL,      -- role names; {public} for every role
    using_expr text,                 -- as pg_get_expr prints it, names schema-qualified
    check_expr text,
    named      text                  -- the objects the expressions name, with their owners
);
REVOKE ALL ON @extschema@.idem_row_security, @extschema@.idem_policies FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_row_security', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_policies', '');

-- 42501 unless the caller has the privileges of idem_keys' owner (a superuser has them), as
-- ALTER TABLE and CREATE POLICY require.
CREATE FUNCTION @extschema@.idem_sql_row_security_owner(what text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NOT pg_catalog.pg_has_role(
             (SELECT c.relowner FROM pg_catalog.pg_class c
               WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass),
             'USAGE') THEN
        RAISE EXCEPTION 'only the owner of idem_keys can %', what
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run it as the owner of idem_keys or a superuser.';
    END IF;
END
$fn$;

-- idem_keys' policies as the record holds them: the command, the role names sorted ("public" for
-- every role), the expressions as PostgreSQL prints them under this search_path (every name
-- outside pg_catalog schema-qualified), and the objects they name (other than idem_keys and
-- pinned built-ins), each with its owner, sorted, one a line, as the C edition records them: a
-- restore compares them again after re-creating the policy, so that a name now resolving to
-- another object, or to one of another owner, is refused instead of bound. (Line breaks are
-- chr(10): sql-edition/build reads a backslash-n in a function's source as one.)
CREATE FUNCTION @extschema@.idem_sql_row_security_live()
RETURNS TABLE (name text, permissive boolean, command text, roles text[], using_expr text,
               check_expr text, named text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN QUERY
    SELECT p.polname::text, p.polpermissive,
           CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                         WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
           ARRAY(SELECT CASE r WHEN 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(r)::text END
                   FROM pg_catalog.unnest(p.polroles) AS r ORDER BY 1),
           pg_catalog.pg_get_expr(p.polqual, p.polrelid),
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid),
           pg_catalog.array_to_string(ARRAY(
               SELECT DISTINCT o.type OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) o.identity
                      OPERATOR(pg_catalog.||) ' owned by ' OPERATOR(pg_catalog.||) COALESCE(
                        pg_catalog.pg_get_userbyid(CASE d.refclassid
                          WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
                            (SELECT f.proowner FROM pg_catalog.pg_proc f
                              WHERE f.oid OPERATOR(pg_catalog.=) d.refobjid)
                          WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN
                            (SELECT c.relowner FROM pg_catalog.pg_class c
                              WHERE c.oid OPERATOR(pg_catalog.=) d.refobjid)
                          WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN
                            (SELECT t.typowner FROM pg_catalog.pg_type t
                              WHERE t.oid OPERATOR(pg_catalog.=) d.refobjid)
                          WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN
                            (SELECT x.oprowner FROM pg_catalog.pg_operator x
                              WHERE x.oid OPERATOR(pg_catalog.=) d.refobjid)
                          WHEN 'pg_catalog.pg_collation'::pg_catalog.regclass THEN
                            (SELECT l.collowner FROM pg_catalog.pg_collation l
                              WHERE l.oid OPERATOR(pg_catalog.=) d.refobjid)
                        END)::text, '-')
                 FROM pg_catalog.pg_depend d,
                      LATERAL pg_catalog.pg_identify_object(d.refclassid, d.refobjid, 0) o
                WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_policy'::pg_catalog.regclass
                  AND d.objid OPERATOR(pg_catalog.=) p.oid
                  AND NOT (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                           AND d.refobjid OPERATOR(pg_catalog.=) p.polrelid)
                ORDER BY 1), pg_catalog.chr(10))
      FROM pg_catalog.pg_policy p
     WHERE p.polrelid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass;
END
$fn$;

-- Records what idem_keys has now: its row-level security flags (a row while either is on) and
-- its policies, as the C edition's event triggers record them after the DDL. The owner runs it
-- after changing them (ALTER TABLE ... ROW LEVEL SECURITY, CREATE, ALTER or DROP POLICY). Returns
-- the number of policies recorded.
CREATE FUNCTION @extschema@.idem_row_security_record()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    policies integer;
BEGIN
    PERFORM @extschema@.idem_sql_row_security_owner('record its row-level security');
    -- One statement, rows that are already right left alone: the record's statement triggers
    -- fire at its end and find the record in step with idem_keys, so they change nothing.
    WITH live_flags AS (
        SELECT c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced
          FROM pg_catalog.pg_class c
         WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass
           AND (c.relrowsecurity OR c.relforcerowsecurity)),
    flags_off AS (
        DELETE FROM @extschema@.idem_row_security WHERE NOT EXISTS (SELECT FROM live_flags)),
    flags_on AS (
        INSERT INTO @extschema@.idem_row_security AS r (single, enabled, forced)
        SELECT true, f.enabled, f.forced FROM live_flags f
        ON CONFLICT (single) DO UPDATE SET enabled = excluded.enabled, forced = excluded.forced
         WHERE (r.enabled, r.forced) IS DISTINCT FROM (excluded.enabled, excluded.forced)),
    live AS (
        SELECT l.name COLLATE pg_catalog."C" AS name, l.permissive, l.command, l.roles,
               l.using_expr, l.check_expr, l.named
          FROM @extschema@.idem_sql_row_security_live() l),
    dropped AS (
        DELETE FROM @extschema@.idem_policies r
         WHERE NOT EXISTS (SELECT FROM live l WHERE l.name OPERATOR(pg_catalog.=) r.name)),
    written AS (
        INSERT INTO @extschema@.idem_policies AS r
               (name, permissive, command, roles, using_expr, check_expr, named)
        SELECT l.name, l.permissive, l.command, l.roles, l.using_expr, l.check_expr, l.named
          FROM live l
        ON CONFLICT (name) DO UPDATE
           SET permissive = excluded.permissive, command = excluded.command,
               roles = excluded.roles, using_expr = excluded.using_expr,
               check_expr = excluded.check_expr, named = excluded.named
         WHERE (r.permissive, r.command, r.roles, r.using_expr, r.check_expr, r.named)
               IS DISTINCT FROM (excluded.permissive, excluded.command, excluded.roles,
                                 excluded.using_expr, excluded.check_expr, excluded.named))
    SELECT pg_catalog.count(*) INTO policies FROM live;
    RETURN policies;
END
$fn$;

-- Whether idem_keys has exactly what the record says: the flags, and the recorded policies with
-- nothing more or less (their objects too, where the record has them).
CREATE FUNCTION @extschema@.idem_sql_row_security_in_step()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (SELECT ROW(COALESCE(pg_catalog.bool_or(r.enabled), false),
                       COALESCE(pg_catalog.bool_or(r.forced), false))::text
              FROM @extschema@.idem_row_security r)
           OPERATOR(pg_catalog.=)
           (SELECT ROW(c.relrowsecurity, c.relforcerowsecurity)::text
              FROM pg_catalog.pg_class c
             WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass)
       AND (SELECT pg_catalog.string_agg(ROW(r.name, r.permissive, r.command, r.roles, r.using_expr,
                                             r.check_expr, COALESCE(r.named, l.named))::text,
                                         pg_catalog.chr(10) ORDER BY r.name)
              FROM @extschema@.idem_policies r
              LEFT JOIN @extschema@.idem_sql_row_security_live() l
                ON l.name OPERATOR(pg_catalog.=) r.name COLLATE pg_catalog."C")
           IS NOT DISTINCT FROM
           (SELECT pg_catalog.string_agg(ROW(l.name, l.permissive, l.command, l.roles, l.using_expr,
                                             l.check_expr, l.named)::text,
                                         pg_catalog.chr(10) ORDER BY l.name COLLATE pg_catalog."C")
              FROM @extschema@.idem_sql_row_security_live() l);
END
$fn$;

-- Makes idem_keys' row-level security and policies what the two tables record: the flags, every
-- recorded policy (re-created, and refused with IK006 when an object it names is not the one
-- recorded), and no policy the tables do not record. Runs by itself when a restore loads the
-- tables; run it by hand after a data-only restore with --disable-triggers. Records again what
-- idem_keys then has (as PostgreSQL prints it now). Returns the number of policies.
CREATE FUNCTION @extschema@.idem_row_security_apply()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    keys    text := pg_catalog.format('%I.idem_keys', '@extschema@');
    enabled boolean;
    forced  boolean;
    pol     record;
    named   text;
    unsafe  text;     -- a recorded policy that could make more than one statement
    n       integer := 0;
BEGIN
    PERFORM @extschema@.idem_sql_row_security_owner('apply the record of its row-level security');
    -- The recorded expressions are text that only the owner of idem_keys can write, but a
    -- superuser's restore runs them: each must make exactly one CREATE POLICY, or an expression
    -- like "true); ALTER ROLE ... SUPERUSER; ... (true" would run as that superuser. Without
    -- PostgreSQL's parser at hand, any ';' is refused (one in a string literal too), and the
    -- command is checked here: the owner can drop the table's CHECK.
    SELECT r.name INTO unsafe FROM @extschema@.idem_policies r
     WHERE pg_catalog.strpos(COALESCE(r.using_expr, '') OPERATOR(pg_catalog.||) COALESCE(r.check_expr, ''), ';')
           OPERATOR(pg_catalog.>) 0
        OR r.command IS NULL
        OR NOT r.command OPERATOR(pg_catalog.=) ANY ('{ALL,SELECT,INSERT,UPDATE,DELETE}'::text[])
     ORDER BY r.name LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'policy "%" of idem_keys is not re-created: its record is not one policy', unsafe
            USING ERRCODE = 'IK006',
                  DETAIL = 'Its USING or WITH CHECK expression holds a ";", or its command is none of ALL, SELECT, INSERT, UPDATE, DELETE: either could end the CREATE POLICY statement.',
                  HINT = 'Correct the row of idem_policies (only the owner of idem_keys can write it), '
                         'then run SELECT idem_row_security_apply().';
    END IF;
    SELECT COALESCE(pg_catalog.bool_or(r.enabled), false), COALESCE(pg_catalog.bool_or(r.forced), false)
      INTO enabled, forced FROM @extschema@.idem_row_security r;
    FOR pol IN SELECT p.polname FROM pg_catalog.pg_policy p
                WHERE p.polrelid OPERATOR(pg_catalog.=) keys::pg_catalog.regclass LOOP
        EXECUTE pg_catalog.format('DROP POLICY %I ON %s', pol.polname, keys);
    END LOOP;
    FOR pol IN
        SELECT r.name, r.named,
               pg_catalog.format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s', r.name, keys,
                   CASE WHEN r.permissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END, r.command,
                   (SELECT pg_catalog.string_agg(CASE x WHEN 'public' THEN 'PUBLIC'
                                                      ELSE pg_catalog.quote_ident(x) END, ', ')
                      FROM pg_catalog.unnest(r.roles) AS x),
                   CASE WHEN r.using_expr IS NULL THEN ''
                        ELSE ' USING (' OPERATOR(pg_catalog.||) r.using_expr OPERATOR(pg_catalog.||) ')' END,
                   CASE WHEN r.check_expr IS NULL THEN ''
                        ELSE ' WITH CHECK (' OPERATOR(pg_catalog.||) r.check_expr OPERATOR(pg_catalog.||) ')' END)
                 AS create_policy
          FROM @extschema@.idem_policies r ORDER BY r.name
    LOOP
        EXECUTE pol.create_policy;
        IF pol.named IS NOT NULL THEN
            SELECT l.named INTO named FROM @extschema@.idem_sql_row_security_live() l
             WHERE l.name OPERATOR(pg_catalog.=) pol.name;
            IF named IS DISTINCT FROM pol.named THEN
                RAISE EXCEPTION 'policy "%" of idem_keys names objects other than those recorded', pol.name
                    USING ERRCODE = 'IK006',
                          DETAIL = pg_catalog.format('Recorded: %s. Now: %s.',
                                       COALESCE(NULLIF(pol.named, ''), 'none'),
                                       COALESCE(NULLIF(named, ''), 'none')),
                          HINT = 'An object the policy names was renamed, dropped or replaced since it was '
                                 'recorded. Check the objects, then correct the row of idem_policies.';
            END IF;
        END IF;
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    EXECUTE pg_catalog.format('ALTER TABLE %s %s ROW LEVEL SECURITY', keys,
                              CASE WHEN enabled THEN 'ENABLE' ELSE 'DISABLE' END);
    EXECUTE pg_catalog.format('ALTER TABLE %s %s ROW LEVEL SECURITY', keys,
                              CASE WHEN forced THEN 'FORCE' ELSE 'NO FORCE' END);
    PERFORM @extschema@.idem_row_security_record();
    RETURN n;
END
$fn$;

-- True, or IK006 when the record says row-level security is enabled and idem_keys lacks it, is
-- not forced as recorded, lacks a recorded policy, or has a policy whose roles are not the
-- recorded ones. About the table, whoever calls it; it reads the record, so it needs SELECT on
-- the two tables (the owner has it). The SQL edition's other functions do not check this at each
-- call, as the C edition's do (docs/editions.md).
CREATE FUNCTION @extschema@.idem_row_security_check()
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    recorded record;
    live     record;
    missing  text;
BEGIN
    SELECT r.enabled, r.forced INTO recorded FROM @extschema@.idem_row_security r;
    IF NOT COALESCE(recorded.enabled, false) THEN
        RETURN true;
    END IF;
    SELECT c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced INTO live
      FROM pg_catalog.pg_class c
     WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass;
    IF NOT live.enabled THEN
        missing := 'It is recorded as enabled, but row-level security is disabled.';
    ELSIF recorded.forced AND NOT live.forced THEN
        missing := 'It is recorded as enabled, but row-level security is not forced.';
    ELSE
        SELECT CASE WHEN l.name IS NULL
                    THEN pg_catalog.format('The recorded policy "%s" is missing.', r.name)
                    ELSE pg_catalog.format('The roles of policy "%s" are not those recorded (a role '
                                           'was renamed, or dropped from the policy, since).', r.name) END
          INTO missing
          FROM @extschema@.idem_policies r
          LEFT JOIN @extschema@.idem_sql_row_security_live() l
            ON l.name OPERATOR(pg_catalog.=) r.name COLLATE pg_catalog."C"
         WHERE l.name IS NULL
            OR ARRAY(SELECT x FROM pg_catalog.unnest(r.roles) x ORDER BY 1)
               OPERATOR(pg_catalog.<>) ARRAY(SELECT x FROM pg_catalog.unnest(l.roles) x ORDER BY 1)
         ORDER BY r.name
         LIMIT 1;
    END IF;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'row-level security of idem_keys is not in force'
            USING ERRCODE = 'IK006', DETAIL = missing,
                  HINT = 'The owner of idem_keys runs SELECT idem_row_security_apply(), or records the '
                         'row-level security in force with SELECT idem_row_security_record().';
    END IF;
    RETURN true;
END
$fn$;

-- A write of the record (a restore loading its rows with COPY, or the owner) makes idem_keys what
-- it says. A write by a role without the privileges of idem_keys' owner is refused (42501). A
-- failure to apply it (a policy naming a role the new cluster lacks, say) is a WARNING, so that
-- the restore goes on, and row-level security is turned on as recorded all the same;
-- idem_row_security_check() then says what is missing.
CREATE FUNCTION @extschema@.idem_row_security_restore()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    detail text;
    keys    text := pg_catalog.format('%I.idem_keys', '@extschema@');
    flags   record;
BEGIN
    PERFORM @extschema@.idem_sql_row_security_owner('change the record of its row-level security');
    IF @extschema@.idem_sql_row_security_in_step() THEN
        RETURN NULL;
    END IF;
    BEGIN
        PERFORM @extschema@.idem_row_security_apply();
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
        -- Closed, not open: with no IK006 at each call (docs/editions.md), a restore that cannot
        -- re-create the policies still turns on what the record says is on, so that the roles
        -- it would confine see no key rather than every tenant's.
        SELECT r.enabled, r.forced INTO flags FROM @extschema@.idem_row_security r;
        IF flags.enabled THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', keys);
        END IF;
        IF flags.forced THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', keys);
        END IF;
        RAISE WARNING 'row-level security of idem_keys was not restored: %', SQLERRM
            USING ERRCODE = SQLSTATE,
                  DETAIL = COALESCE(NULLIF(detail, ''), 'The record''s policies were not created.')
                           OPERATOR(pg_catalog.||) CASE WHEN flags.enabled
                               THEN ' Row-level security is on, with only the policies idem_keys had before '
                                    '(after a restore, none: the roles it confines see no key).'
                               ELSE ' idem_keys is left as it was.' END,
                  HINT = 'Fix the cause, then run SELECT idem_row_security_apply() as the owner of '
                         'idem_keys; SELECT idem_row_security_check() says what is missing.';
    END;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER idem_row_security_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_row_security
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
CREATE TRIGGER idem_policies_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_policies
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
