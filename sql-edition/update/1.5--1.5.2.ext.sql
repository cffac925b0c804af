-- (extension routes only, after the functions) The record of idem_keys' row-level security
-- (docs/contract.md §13), new in 1.5.2: its tables and their triggers, as src/60-row-security.ext.sql
-- creates them; then what idem_keys has now is recorded, when the role updating has the
-- privileges of its owner (else the owner runs SELECT idem_row_security_record()).
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
CREATE TRIGGER idem_row_security_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_row_security
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
CREATE TRIGGER idem_policies_restore
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.idem_policies
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_row_security_restore();
SELECT @extschema@.idem_row_security_record()
 WHERE pg_catalog.pg_has_role(
         (SELECT c.relowner FROM pg_catalog.pg_class c
           WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass),
         'USAGE');
