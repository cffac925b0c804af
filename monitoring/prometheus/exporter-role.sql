-- The role prometheus-postgres-exporter connects as, with only what queries.yaml reads:
-- idem_stats, and four columns of idem_keys (state, created_at, locked_until, expires_at), never
-- a scope (tenant), key, fingerprint or response. No pg_monitor, no write, no idem_stats_reset().
-- Run it as a superuser in every database that has the extension and is scraped:
--   psql -d app -f exporter-role.sql
-- Per-scope series (idem_scope_stats) carry scope names as labels, which can name tenants: only
-- with -v per_scope=on does the role get SELECT on idem_keys.scope, which lets it see them; run
-- without it (or with -v per_scope=off) the script takes that grant back, so the role ends up
-- with what this run's flags say. Then let the role log in (monitoring/prometheus/README.md: a
-- password and a password file, or peer over the unix socket for the exporter's system user).
DO $$
DECLARE
    extschema name;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'idempotency_exporter') THEN
        CREATE ROLE idempotency_exporter LOGIN;
        -- a scrape must never write, and never run for long: the table query scans idem_keys
        ALTER ROLE idempotency_exporter SET default_transaction_read_only = on;
        ALTER ROLE idempotency_exporter SET statement_timeout = '30s';
        -- compiling the table query would cost more than running it on most tables
        ALTER ROLE idempotency_exporter SET jit = off;
    END IF;

    SELECT n.nspname INTO STRICT extschema
    FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'idempotency';

    EXECUTE pg_catalog.format('GRANT CONNECT ON DATABASE %I TO idempotency_exporter',
                              pg_catalog.current_database());
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO idempotency_exporter', extschema);
    EXECUTE pg_catalog.format('GRANT SELECT ON %I.idem_stats TO idempotency_exporter', extschema);
    EXECUTE pg_catalog.format(
        'GRANT SELECT (state, created_at, locked_until, expires_at) ON %I.idem_keys TO idempotency_exporter',
        extschema);
    -- queries.yaml names the extension's objects without a schema
    EXECUTE pg_catalog.format('ALTER ROLE idempotency_exporter IN DATABASE %I SET search_path = %I',
                              pg_catalog.current_database(), extschema);
END
$$;

\if :{?per_scope}
\else
\set per_scope off
\endif
\if :per_scope
\set scope_grant 'GRANT SELECT (scope) ON %I.idem_keys TO idempotency_exporter'
\else
\set scope_grant 'REVOKE SELECT (scope) ON %I.idem_keys FROM idempotency_exporter'
\endif
SELECT pg_catalog.format(:'scope_grant', n.nspname)
  FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
 WHERE e.extname = 'idempotency'
\gexec
