--
-- search_path and object shadowing (issue 5, "Security"): decoys of everything the extension
-- uses -- a table idem_keys (with a planted row that would be replayed if it were read), the
-- types idem_state, idem_outcome and idem_claim_result, a pg_extension table claiming that pg_cron
-- is installed, the functions sha256, clock_timestamp, now, current_setting, current_database,
-- left, md5 and idem_reap, and the operators =, <>, <, <=, >, + and || on the types the extension
-- works with (= on text is "textеq", with a Cyrillic "е") -- in a schema placed before the
-- extension's schema and, in later rounds, explicitly before pg_catalog, and in pg_temp.  Every
-- decoy routine raises "decoy ... was used", every decoy table keeps its one planted row: claims,
-- replays, fingerprints, takeovers, reaping, idem_reap_all and idem_schedule_reaper behave exactly
-- as without decoys, in every round, on the direct path and on the row-level-security path.
--
-- The rounds run the same statements (sec_search_path_steps.psql, calls qualified with the
-- extension's schema public, as a careful caller would) in scope :'scope'.
--
\pset null '(null)'
-- pg_regress feeds this file to psql on stdin: find the included file through PG_ABS_SRCDIR
\getenv abs_srcdir PG_ABS_SRCDIR
\set steps :abs_srcdir '/sql/sec_search_path_steps.psql'
-- try(sql): the statement's first column as text, or "SQLSTATE: message (HINT: ...)" as a row
-- (not an error: psql would print this file's path in front of an error in the included file).
-- Its body uses no operator and only qualified functions, so the decoys cannot take it.
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    res text;
    c   text;
    m   text;
    h   text;
BEGIN
    EXECUTE sql INTO res;
    RETURN res;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS c = RETURNED_SQLSTATE, m = MESSAGE_TEXT, h = PG_EXCEPTION_HINT;
    RETURN pg_catalog.regexp_replace(pg_catalog.format('%s: %s (HINT: %s)', c, m, h), ' \(HINT: \)$', '');
END
$$;
CREATE SCHEMA evil;
-- routines
CREATE FUNCTION evil."textеq"(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy =(text, text) was used'; END $$;
CREATE FUNCTION evil.text_ne(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <>(text, text) was used'; END $$;
CREATE FUNCTION evil.text_cat(text, text) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy ||(text, text) was used'; END $$;
CREATE FUNCTION evil.bytea_eq(bytea, bytea) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy =(bytea, bytea) was used'; END $$;
CREATE FUNCTION evil.jsonb_eq(jsonb, jsonb) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy =(jsonb, jsonb) was used'; END $$;
CREATE FUNCTION evil.int_eq(integer, integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy =(integer, integer) was used'; END $$;
CREATE FUNCTION evil.int_lt(integer, integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <(integer, integer) was used'; END $$;
CREATE FUNCTION evil.int84_lt(bigint, integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <(bigint, integer) was used'; END $$;
CREATE FUNCTION evil.int8_lt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <(bigint, bigint) was used'; END $$;
CREATE FUNCTION evil.int8_pl(bigint, bigint) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy +(bigint, bigint) was used'; END $$;
CREATE FUNCTION evil.int_pl(integer, integer) RETURNS integer LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy +(integer, integer) was used'; END $$;
CREATE FUNCTION evil.ts_le(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <=(timestamptz, timestamptz) was used'; END $$;
CREATE FUNCTION evil.ts_lt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy <(timestamptz, timestamptz) was used'; END $$;
CREATE FUNCTION evil.ts_gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy >(timestamptz, timestamptz) was used'; END $$;
CREATE OPERATOR evil.=  (LEFTARG = text, RIGHTARG = text, FUNCTION = evil."textеq");
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.text_ne);
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.text_cat);
CREATE OPERATOR evil.=  (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = evil.bytea_eq);
CREATE OPERATOR evil.=  (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = evil.jsonb_eq);
CREATE OPERATOR evil.=  (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int_eq);
CREATE OPERATOR evil.<  (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int_lt);
CREATE OPERATOR evil.<  (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.int84_lt);
CREATE OPERATOR evil.<  (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_lt);
CREATE OPERATOR evil.+  (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_pl);
CREATE OPERATOR evil.+  (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int_pl);
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.ts_le);
CREATE OPERATOR evil.<  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.ts_lt);
CREATE OPERATOR evil.>  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.ts_gt);
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy sha256 was used'; END $$;
CREATE FUNCTION evil.md5(text) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy md5 was used'; END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy clock_timestamp was used'; END $$;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy now was used'; END $$;
CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy current_setting was used'; END $$;
CREATE FUNCTION evil.current_database() RETURNS name LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy current_database was used'; END $$;
CREATE FUNCTION evil.left(text, integer) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy left was used'; END $$;
CREATE FUNCTION evil.idem_reap(integer) RETURNS bigint LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'decoy idem_reap was used'; END $$;
-- types and tables
CREATE TYPE evil.idem_state AS ENUM ('planted');
CREATE TYPE evil.idem_outcome AS ENUM ('planted');
CREATE TYPE evil.idem_claim_result AS (outcome text);
CREATE TABLE evil.idem_keys (LIKE public.idem_keys INCLUDING ALL);
INSERT INTO evil.idem_keys (scope, key, state, attempt, response, response_code, created_at, completed_at, expires_at)
SELECT s, 'sp-1', 'succeeded', 1, '{"planted": true}', 299, now(), now(), now() + interval '1 day'
FROM unnest(ARRAY['sp-evil', 'sp-pg_temp', 'sp-evil-before-catalog', 'sp-all', 'sp-rls']) s;
CREATE TABLE evil.pg_extension (extname name);
INSERT INTO evil.pg_extension VALUES ('pg_cron');
CREATE TYPE pg_temp.idem_state AS ENUM ('planted');
CREATE TEMP TABLE idem_keys (LIKE public.idem_keys INCLUDING ALL);
INSERT INTO pg_temp.idem_keys SELECT * FROM evil.idem_keys;
CREATE TEMP TABLE pg_extension (extname name);
INSERT INTO pg_temp.pg_extension VALUES ('pg_cron');

-- 1. the decoy schema before the extension's (pg_catalog implicitly first)
SET search_path = evil, public;
\set scope 'sp-evil'
\i :steps
-- 2. pg_temp first
SET search_path = pg_temp, evil, public;
\set scope 'sp-pg_temp'
\i :steps
-- 3. the decoy schema explicitly before pg_catalog
SET search_path = evil, pg_catalog, public;
\set scope 'sp-evil-before-catalog'
\i :steps
-- 4. both, before pg_catalog
SET search_path = pg_temp, evil, pg_catalog, public;
\set scope 'sp-all'
\i :steps
RESET search_path;

-- 5. the row-level-security path (SQL through SPI) for a role the policies apply to
CREATE ROLE regress_idem_sp;
-- (public.idem_keys: from here on, an unqualified idem_keys is the decoy in pg_temp)
GRANT SELECT, INSERT, UPDATE, DELETE ON public.idem_keys TO regress_idem_sp;
GRANT USAGE ON SCHEMA evil TO regress_idem_sp;
ALTER TABLE public.idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY regress_idem_sp ON public.idem_keys USING (scope LIKE 'sp-%') WITH CHECK (scope LIKE 'sp-%');
SET ROLE regress_idem_sp;
SET search_path = pg_temp, evil, pg_catalog, public;
\set scope 'sp-rls'
\i :steps
RESET search_path;
RESET ROLE;
DROP POLICY regress_idem_sp ON public.idem_keys;
ALTER TABLE public.idem_keys DISABLE ROW LEVEL SECURITY;

-- The fingerprints are SHA-256 of the scope, a 0x00 byte and the canonical request, as without
-- decoys; the decoy tables still hold only their planted rows; every round left the same keys.
SELECT scope,
       fingerprint = sha256(convert_to(scope, 'UTF8') || '\x00'::bytea
                            || convert_to('{"a": 1, "b": [true, null]}'::jsonb::text, 'UTF8')) AS fingerprint_ok
FROM public.idem_keys WHERE key = 'sp-1' ORDER BY scope;
SELECT scope, string_agg(key || ':' || state || ':' || attempt, ' ' ORDER BY key) AS keys
FROM public.idem_keys WHERE scope LIKE 'sp-%' GROUP BY scope ORDER BY scope;
SELECT count(*) AS planted, count(*) FILTER (WHERE response = '{"planted": true}') AS intact FROM evil.idem_keys;
SELECT count(*) AS planted, count(*) FILTER (WHERE response = '{"planted": true}') AS intact FROM pg_temp.idem_keys;

DELETE FROM public.idem_keys WHERE scope LIKE 'sp-%';
REVOKE ALL ON public.idem_keys FROM regress_idem_sp;
REVOKE ALL ON SCHEMA evil FROM regress_idem_sp;
DROP ROLE regress_idem_sp;
SET client_min_messages = warning;
DROP SCHEMA evil CASCADE;
RESET client_min_messages;
DROP TABLE pg_temp.idem_keys, pg_temp.pg_extension;
DROP TYPE pg_temp.idem_state;
