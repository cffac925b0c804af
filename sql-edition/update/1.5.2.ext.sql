-- (extension routes only) An update to 1.5.2, which brings the record of idem_keys' row-level
-- security (docs/contract.md §13, src/60-row-security.ext.sql, created by the update as a
-- fragment new since the old version): what idem_keys has now is recorded, when the role
-- updating has the privileges of its owner (else the owner runs SELECT idem_row_security_record()).
SELECT @extschema@.idem_row_security_record()
 WHERE pg_catalog.pg_has_role(
         (SELECT c.relowner FROM pg_catalog.pg_class c
           WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.idem_keys'::pg_catalog.regclass),
         'USAGE');
