-- idempotency 1.4 -> 1.5: row-level security on idem_keys that survives dumps and restores.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- 1.5: true, or IK006 for a role that the recorded row-level security (idem_row_security,
-- idem_policies) would confine while idem_keys lacks it; idem_stalled checks it.
CREATE FUNCTION @extschema@.idem_row_security_check()
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_row_security_check'
LANGUAGE C STABLE PARALLEL RESTRICTED;

-- Pending keys whose lease has ended and that have not expired: the owner crashed or gave up
-- without a result. security_invoker: the caller's privileges and row-level security policies on
-- idem_keys apply, as if the caller queried the table.
CREATE OR REPLACE VIEW @extschema@.idem_stalled WITH (security_invoker = true) AS
    SELECT k.scope, k.key, k.attempt, k.locked_until, k.created_at,
           pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) k.locked_until AS stalled_for
      FROM @extschema@.idem_keys AS k
     WHERE @extschema@.idem_row_security_check()
       AND k.state OPERATOR(pg_catalog.=) 'pending'::@extschema@.idem_state
       AND k.locked_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()
       AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
     ORDER BY k.locked_until, k.scope, k.key;

-- row-level security that survives dumps and restores (1.5)

-- pg_dump leaves out an extension table's ENABLE ROW LEVEL SECURITY and its policies, but dumps
-- the rows of the extension's configuration tables. These two tables record what idem_keys has
-- (event triggers keep them in step with the DDL that changes it), and their triggers put it back
-- when a restore loads their rows. No row in idem_row_security: row-level security was never
-- enabled. Owner only: writing them changes idem_keys' policies.
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
    check_expr text
);
REVOKE ALL ON @extschema@.idem_row_security, @extschema@.idem_policies FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_row_security', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_policies', '');

-- Writes what idem_keys has now into the tables: its row-level security flags, its policies, or
-- both. Expressions are printed with search_path = pg_catalog, pg_temp, so that every other name
-- comes out schema-qualified and means the same when a restore re-creates the policy.
CREATE FUNCTION @extschema@.idem_row_security_record(flags boolean, policies boolean)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys oid := '@extschema@.idem_keys'::pg_catalog.regclass;
BEGIN
    -- the rows below are written to match idem_keys: their triggers must not apply them back
    PERFORM pg_catalog.set_config('idempotency_row_security.applying', 'on', true);
    IF flags THEN
        DELETE FROM @extschema@.idem_row_security;
        INSERT INTO @extschema@.idem_row_security (enabled, forced)
            SELECT c.relrowsecurity, c.relforcerowsecurity FROM pg_catalog.pg_class c
             WHERE c.oid = keys AND (c.relrowsecurity OR c.relforcerowsecurity);
    END IF;
    IF policies THEN
        DELETE FROM @extschema@.idem_policies;
        INSERT INTO @extschema@.idem_policies
            SELECT p.polname, p.polpermissive,
                   CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                 WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                   ARRAY(SELECT CASE r WHEN 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(r)::text END
                           FROM pg_catalog.unnest(p.polroles) AS r ORDER BY 1),
                   pg_catalog.pg_get_expr(p.polqual, p.polrelid),
                   pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
              FROM pg_catalog.pg_policy p WHERE p.polrelid = keys;
    END IF;
    PERFORM pg_catalog.set_config('idempotency_row_security.applying', 'off', true);
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_record(boolean, boolean) FROM PUBLIC;

-- Makes idem_keys' row-level security and policies what the two tables record: the flags, every
-- recorded policy (re-created), and no policy the tables do not record. Needs the ownership of
-- idem_keys, like ALTER TABLE. Runs by itself when a restore loads the tables; run it by hand
-- after a data-only restore with --disable-triggers. Returns the number of policies.
CREATE FUNCTION @extschema@.idem_row_security_apply()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys text := pg_catalog.format('%I.idem_keys', '@extschema@');
    state record;
    pol record;
    n integer := 0;
BEGIN
    PERFORM pg_catalog.set_config('idempotency_row_security.applying', 'on', true);
    FOR pol IN SELECT p.polname FROM pg_catalog.pg_policy p
                WHERE p.polrelid = '@extschema@.idem_keys'::pg_catalog.regclass LOOP
        EXECUTE pg_catalog.format('DROP POLICY %I ON %s', pol.polname, keys);
    END LOOP;
    FOR pol IN SELECT * FROM @extschema@.idem_policies ORDER BY name LOOP
        EXECUTE pg_catalog.format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s',
            pol.name, keys, CASE WHEN pol.permissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
            pol.command,
            (SELECT pg_catalog.string_agg(CASE r WHEN 'public' THEN 'PUBLIC'
                                                 ELSE pg_catalog.quote_ident(r) END, ', ')
               FROM pg_catalog.unnest(pol.roles) AS r),
            CASE WHEN pol.using_expr IS NULL THEN '' ELSE ' USING (' || pol.using_expr || ')' END,
            CASE WHEN pol.check_expr IS NULL THEN '' ELSE ' WITH CHECK (' || pol.check_expr || ')' END);
        n := n + 1;
    END LOOP;
    SELECT * INTO state FROM @extschema@.idem_row_security;
    EXECUTE pg_catalog.format('ALTER TABLE %s %s ROW LEVEL SECURITY', keys,
        CASE WHEN coalesce(state.enabled, false) THEN 'ENABLE' ELSE 'DISABLE' END);
    EXECUTE pg_catalog.format('ALTER TABLE %s %s ROW LEVEL SECURITY', keys,
        CASE WHEN coalesce(state.forced, false) THEN 'FORCE' ELSE 'NO FORCE' END);
    PERFORM pg_catalog.set_config('idempotency_row_security.applying', 'off', true);
    RETURN n;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_apply() FROM PUBLIC;

-- A restore loading the tables' rows (COPY fires statement triggers) applies them. A failure
-- there (a policy naming a role the new cluster lacks, say) is a warning, so that the restore
-- goes on; the functions then refuse the roles the policies would confine (IK006) until
-- idem_row_security_apply() succeeds.
CREATE FUNCTION @extschema@.idem_row_security_restore()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.current_setting('idempotency_row_security.applying', true) = 'on' THEN
        RETURN NULL;
    END IF;
    BEGIN
        PERFORM @extschema@.idem_row_security_apply();
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'row-level security of idem_keys was not restored: %', SQLERRM
            USING ERRCODE = SQLSTATE,
                  HINT = 'Fix the cause, then run SELECT idem_row_security_apply() as the owner of idem_keys.';
    END;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_restore() FROM PUBLIC;
CREATE TRIGGER idem_row_security_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_row_security
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
CREATE TRIGGER idem_policies_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_policies
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();

-- DDL that changes idem_keys' row-level security or policies is recorded as it happens, so that
-- the documented ALTER TABLE and CREATE POLICY recipes survive a dump with no step of their own.
-- Only a change is recorded: an ALTER TABLE of idem_keys that leaves its flags as they were (a
-- restore's DISABLE TRIGGER, say) must not overwrite a record the restore has not applied yet.
CREATE FUNCTION @extschema@.idem_row_security_ddl_start()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.set_config('idempotency_row_security.before',
        (SELECT c.relrowsecurity::text || c.relforcerowsecurity::text FROM pg_catalog.pg_class c
          WHERE c.oid = '@extschema@.idem_keys'::pg_catalog.regclass), true);
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_ddl_start() FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_row_security_ddl()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keys oid := '@extschema@.idem_keys'::pg_catalog.regclass;
BEGIN
    IF pg_catalog.current_setting('idempotency_row_security.applying', true) = 'on' THEN
        RETURN;
    END IF;
    IF TG_EVENT = 'sql_drop' THEN
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_dropped_objects() d
                    WHERE d.object_type = 'policy'
                      AND d.address_names[1] = '@extschema@' AND d.address_names[2] = 'idem_keys') THEN
            PERFORM @extschema@.idem_row_security_record(false, true);
        END IF;
    ELSIF TG_TAG = 'ALTER TABLE' THEN
        IF (SELECT c.relrowsecurity::text || c.relforcerowsecurity::text FROM pg_catalog.pg_class c
             WHERE c.oid = keys)
           IS DISTINCT FROM pg_catalog.current_setting('idempotency_row_security.before', true) THEN
            PERFORM @extschema@.idem_row_security_record(true, false);
        END IF;
    ELSIF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c
                   JOIN pg_catalog.pg_policy p ON p.oid = c.objid
                  WHERE c.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass
                    AND p.polrelid = keys) THEN
        PERFORM @extschema@.idem_row_security_record(false, true);
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_ddl() FROM PUBLIC;
CREATE EVENT TRIGGER idem_row_security_ddl_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl_start();
CREATE EVENT TRIGGER idem_row_security_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE POLICY', 'ALTER POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();
CREATE EVENT TRIGGER idem_row_security_drop ON sql_drop
    WHEN TAG IN ('DROP POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();

-- What idem_keys has now becomes the record: row-level security set up by hand under 1.4 is kept
-- by dumps from here on.
SELECT @extschema@.idem_row_security_record(true, true);
