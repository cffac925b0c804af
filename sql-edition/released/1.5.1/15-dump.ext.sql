-- (extension routes only) pg_dump keeps the keys of an extension's configuration table.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_keys', '');
