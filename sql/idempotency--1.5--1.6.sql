-- idempotency 1.5 -> 1.6: the record of idem_keys' row-level security is kept without SECURITY
-- DEFINER and without trusting a setting, read by every session at every check, and checked
-- against renamed or replaced objects when a restore applies it (docs/security.md).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.6'" to load this file. \quit

-- 1.5 decided whether an ALTER TABLE changed the flags by comparing with a setting any role could
-- set, and wrote the record as the extension's owner (SECURITY DEFINER): gone.
DROP EVENT TRIGGER idem_row_security_ddl_start;
DROP EVENT TRIGGER idem_row_security_ddl;
DROP EVENT TRIGGER idem_row_security_drop;
DROP FUNCTION @extschema@.idem_row_security_ddl_start();
DROP FUNCTION @extschema@.idem_row_security_ddl();
DROP FUNCTION @extschema@.idem_row_security_record(boolean, boolean);
DROP TRIGGER idem_row_security_restore ON @extschema@.idem_row_security;
DROP TRIGGER idem_policies_restore ON @extschema@.idem_policies;
DROP FUNCTION @extschema@.idem_row_security_restore();
DROP FUNCTION @extschema@.idem_row_security_apply();

ALTER TABLE @extschema@.idem_policies
    ADD COLUMN named text;           -- the objects the expressions name, with their owners (1.6)

-- The record belongs to idem_keys' owner (from now on it follows ALTER TABLE idem_keys OWNER TO).
DO $$
DECLARE
    owner name := (SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c
                    WHERE c.oid = '@extschema@.idem_keys'::pg_catalog.regclass);
BEGIN
    EXECUTE pg_catalog.format('ALTER TABLE @extschema@.idem_row_security OWNER TO %I', owner);
    EXECUTE pg_catalog.format('ALTER TABLE @extschema@.idem_policies OWNER TO %I', owner);
END
$$;

-- A recorded policy that idem_keys has now, with the same expressions, gets the objects it names
-- recorded. A record not in force at the update (a data-only restore not applied yet) is carried
-- over as it is; its policies' objects are recorded when it is applied.
UPDATE @extschema@.idem_policies r
   SET named = pg_catalog.array_to_string(ARRAY(
       SELECT DISTINCT o.type || ' ' || o.identity || ' owned by ' || COALESCE(
              pg_catalog.pg_get_userbyid(CASE d.refclassid
                  WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
                      (SELECT f.proowner FROM pg_catalog.pg_proc f WHERE f.oid = d.refobjid)
                  WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN
                      (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = d.refobjid)
                  WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN
                      (SELECT t.typowner FROM pg_catalog.pg_type t WHERE t.oid = d.refobjid)
                  WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN
                      (SELECT x.oprowner FROM pg_catalog.pg_operator x WHERE x.oid = d.refobjid)
                  WHEN 'pg_catalog.pg_collation'::pg_catalog.regclass THEN
                      (SELECT l.collowner FROM pg_catalog.pg_collation l WHERE l.oid = d.refobjid)
              END)::text, '-')
         FROM pg_catalog.pg_depend d, LATERAL pg_catalog.pg_identify_object(d.refclassid, d.refobjid, 0) o
        WHERE d.classid = 'pg_catalog.pg_policy'::pg_catalog.regclass AND d.objid = p.oid
          AND NOT (d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = p.polrelid)
        ORDER BY 1), E'\n')
  FROM pg_catalog.pg_policy p
 WHERE p.polrelid = '@extschema@.idem_keys'::pg_catalog.regclass AND p.polname = r.name
   AND pg_catalog.pg_get_expr(p.polqual, p.polrelid) IS NOT DISTINCT FROM r.using_expr
   AND pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) IS NOT DISTINCT FROM r.check_expr;
-- Makes idem_keys' row-level security and policies what the two tables record: the flags, every
-- recorded policy (re-created, and refused with IK006 when an object it names is not the one
-- recorded), and no policy the tables do not record. The owner of idem_keys only (checked), like
-- ALTER TABLE. Runs by itself when a restore loads the tables; run it by hand after a data-only
-- restore with --disable-triggers. Returns the number of policies.
CREATE FUNCTION @extschema@.idem_row_security_apply()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_row_security_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A restore loading the tables' rows (COPY fires statement triggers) applies them. A failure
-- there (a policy naming a role the new cluster lacks, say) is a warning, so that the restore
-- goes on; the functions then refuse the roles the policies would confine (IK006) until
-- idem_row_security_apply() succeeds. A write by a role that does not own idem_keys is refused.
CREATE FUNCTION @extschema@.idem_row_security_restore()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_row_security_restore'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_restore() FROM PUBLIC;
CREATE TRIGGER idem_row_security_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_row_security
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
CREATE TRIGGER idem_policies_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_policies
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();

-- DDL that changes idem_keys' row-level security, policies or owner is recorded as it happens, so
-- that the documented ALTER TABLE and CREATE POLICY recipes survive a dump with no step of their
-- own. The function runs as the role that ran the DDL (no SECURITY DEFINER): it decides from the
-- command's parse tree and the objects the command changed (by OID) whether idem_keys was
-- touched, reading nothing else and needing no privilege; only then does it write the record, which
-- only idem_keys' owner can. An ALTER TABLE of idem_keys without a row-level security or owner
-- subcommand (a restore's DISABLE TRIGGER, say) records nothing.
CREATE FUNCTION @extschema@.idem_row_security_ddl()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idem_row_security_ddl'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_row_security_ddl() FROM PUBLIC;
CREATE EVENT TRIGGER idem_row_security_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE POLICY', 'ALTER POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();
CREATE EVENT TRIGGER idem_row_security_drop ON sql_drop
    WHEN TAG IN ('DROP POLICY')
    EXECUTE FUNCTION @extschema@.idem_row_security_ddl();

-- A restore loads idem_keys with COPY, with row_security off. A role that does not own idem_keys
-- cannot restore the record (above), so such a COPY into a table without row-level security is
-- refused: the keys are not loaded rather than loaded readable by every tenant
-- (docs/upgrading.md). The functions'
-- writes fire no trigger; an INSERT statement fires this one for nothing but a check of the
-- command's tag.
CREATE FUNCTION @extschema@.idem_keys_load_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_keys_load_check'
LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION @extschema@.idem_keys_load_check() FROM PUBLIC;
CREATE TRIGGER idem_keys_load_check
    BEFORE INSERT ON @extschema@.idem_keys
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_keys_load_check();

-- Which edition answers: 'c' here, 'sql' in the SQL edition (sql-edition/), so that a test or an
-- operator can tell them apart; both implement one contract (docs/editions.md).
CREATE FUNCTION @extschema@.idem_edition()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$ SELECT 'c'::text $fn$;
