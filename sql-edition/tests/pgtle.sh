#!/usr/bin/env bash
# The pg_tle route, as Amazon RDS, Aurora and Supabase offer it: against a running cluster that
# preloads pg_tle and has no file of the C edition (sql-edition/tests/routes starts it).
#
#   pgtle.sh OUT OLD      OUT: sql-edition/build's output; OLD: its output for the newest
#                         released version (sql-edition/build OLD --release VERSION)
#
# A member of pgtle_admin (not a superuser) runs the released version's install script; the
# database's owner (not a superuser) creates the extension; the current version comes as the
# build makes it for a database that has the released one (its full script, the update path, the
# new default) and the owner updates to it: the result is what a fresh install of the current
# version is, in another database; drop and create again. An intruder (no pgtle_admin, not the
# owner) can neither install, replace nor uninstall the extension, nor change its functions. The
# reaper is scheduled with pg_cron (idem_schedule_reaper) by the owner. Last line:
# "N passed, N failed".
set -uo pipefail
OUT=$1 OLD=$2
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

script=$(ls "$OLD"/pg_tle/idempotency--*.sql | grep -v -- '--.*--')
A=$(basename "$script" .sql); A=${A#idempotency--}
fresh=$(ls "$OUT"/pg_tle/idempotency--*.sql | grep -v -- '--.*--')
B=$(basename "$fresh" .sql); B=${B#idempotency--}
next=$OUT/pg_tle/idempotency--$A--$B.sql
[ -f "$next" ] || { not_ok "the build made no update from $A to $B for pg_tle"; summary; exit 1; }

# pg_tle itself (it makes the role pgtle_admin): a superuser's step (on RDS and Aurora,
# rds_superuser's)
if ! setup=$(as postgres postgres -c "CREATE ROLE tle_admin LOGIN" \
      -c "CREATE ROLE tle_owner LOGIN" -c "CREATE ROLE tle_intruder LOGIN" \
      -c "CREATE DATABASE tle_db OWNER tle_owner" 2>&1 &&
    as postgres tle_db -c "CREATE EXTENSION pg_tle" -c "GRANT pgtle_admin TO tle_admin" 2>&1 &&
    as postgres postgres -c "CREATE DATABASE tle_fresh OWNER tle_owner" 2>&1 &&
    as postgres tle_fresh -c "CREATE EXTENSION pg_tle" 2>&1); then
  not_ok "roles, database and pg_tle" "$setup"; summary; exit 1
fi

expect "the installing role is in pgtle_admin and is no superuser" "t|f" tle_admin tle_db \
  "SELECT pg_has_role('pgtle_admin', 'MEMBER'), rolsuper FROM pg_roles WHERE rolname = current_user"
refused "a role without pgtle_admin cannot run the install script" 42501 tle_intruder tle_db -f "$script"
runs "pgtle_admin runs the install script of the released $A" tle_admin tle_db -f "$script"
expect "pg_tle lists idempotency $A" "$A" tle_owner tle_db \
  "SELECT default_version FROM pgtle.available_extensions() WHERE name = 'idempotency'"
refused "a role without pgtle_admin cannot replace the install script" 42501 tle_intruder tle_db \
  -c "SELECT pgtle.install_extension('idempotency', '$A', 'x', 'SELECT 1')"
refused "... nor add a version" 42501 tle_intruder tle_db \
  -c "SELECT pgtle.install_extension_version_sql('idempotency', '9.9', 'SELECT 1')"
refused "... nor an update path" 42501 tle_intruder tle_db \
  -c "SELECT pgtle.install_update_path('idempotency', '$A', '9.9', 'SELECT 1')"
refused "... nor uninstall it" 42501 tle_intruder tle_db -c "SELECT pgtle.uninstall_extension('idempotency')"
refused "... nor write pg_tle's schema directly" 42501 tle_intruder tle_db \
  -c "CREATE FUNCTION pgtle.\"idempotency--9.9.sql\"() RETURNS text LANGUAGE sql AS 'SELECT 1'"

runs "the database owner (no superuser) creates the extension" tle_owner tle_db -c "CREATE EXTENSION idempotency"
expect "the extension belongs to the owner, version $A" "tle_owner|$A" tle_owner tle_db \
  "SELECT extowner::regrole, extversion FROM pg_extension WHERE extname = 'idempotency'"
expect "idem_edition() answers sql" sql tle_owner tle_db "SELECT idem_edition()"
expect "a claim cycle: claimed, succeeded, replay of the response" "claimed|t
succeeded|201
replay|{\"id\": 1}|201" tle_owner tle_db \
  "SELECT outcome, inserted FROM idem_claim('pay-1', request => '{\"a\": 1}');
   SELECT state, response_code FROM idem_complete('pay-1', '{\"id\": 1}', 201);
   SELECT outcome, response, response_code FROM idem_claim('pay-1', request => '{\"a\": 1}')"

refused "an intruder cannot replace an installed function" 42501 tle_intruder tle_db \
  -c "CREATE OR REPLACE FUNCTION public.idem_edition() RETURNS text LANGUAGE sql AS \$\$SELECT 'c'\$\$"
refused "... nor take it over" 42501 tle_intruder tle_db -c "ALTER FUNCTION public.idem_edition() OWNER TO tle_intruder"
refused "... nor update the extension" 42501 tle_intruder tle_db -c "ALTER EXTENSION idempotency UPDATE"
refused "... nor drop it" 42501 tle_intruder tle_db -c "DROP EXTENSION idempotency"
refused "... nor read the keys" 42501 tle_intruder tle_db -c "SELECT count(*) FROM idem_keys"
members="SELECT count(*) FROM pg_depend WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency') AND deptype = 'e'"

refused "a role without pgtle_admin cannot ship the next version" 42501 tle_intruder tle_db -f "$next"
runs "pgtle_admin installs version $B, the update path from $A and the new default" tle_admin tle_db -f "$next"
runs "the owner updates the extension (ALTER EXTENSION idempotency UPDATE)" tle_owner tle_db \
  -c "ALTER EXTENSION idempotency UPDATE"
expect "the extension is at $B, still the SQL edition" "$B|sql" tle_owner tle_db \
  "SELECT extversion, idem_edition() FROM pg_extension WHERE extname = 'idempotency'"
runs "in another database, pgtle_admin installs $B afresh" tle_admin tle_fresh -f "$fresh"
runs "... and the owner creates it there" tle_owner tle_fresh -c "CREATE EXTENSION idempotency"
expect "the updated extension is the fresh one: the same objects, definitions and privileges, as many members" \
  "$(as tle_owner tle_fresh -c "$(catalog_of public)" -c "$members" 2>&1)" tle_owner tle_db "$(catalog_of public); $members"
expect "the key claimed before the update replays after it" "replay|{\"id\": 1}" tle_owner tle_db \
  "SELECT outcome, response FROM idem_claim('pay-1', request => '{\"a\": 1}')"

# the reaper through pg_cron (cron.database_name is this database): a superuser's pg_cron, the
# owner schedules, the job's command reaps as the owner, and unschedules
# (pg_cron's schedule_in_database needs its EXECUTE grant)
setup=$(as postgres tle_db -c "CREATE EXTENSION pg_cron" -c "GRANT USAGE ON SCHEMA cron TO tle_owner, tle_intruder" \
          -c "GRANT EXECUTE ON FUNCTION cron.schedule_in_database TO tle_owner" 2>&1) ||
  not_ok "pg_cron in tle_db" "$setup"
job=$(as tle_owner tle_db -c "SELECT idem_schedule_reaper('*/5 * * * *')" 2>&1)
expect "the owner schedules the reaper with pg_cron (idem_schedule_reaper)" \
  "*/5 * * * *|CALL public.idem_reap_all()|tle_db|tle_owner" tle_owner tle_db \
  "SELECT schedule, command, database, username FROM cron.job WHERE jobid = '$job'"
runs "the job's command runs as the owner (it commits: outside a transaction)" tle_owner tle_db \
  -c "$(as tle_owner tle_db -c "SELECT command FROM cron.job WHERE jobid = '$job'" 2>&1)"
expect "an intruder does not see the owner's job (cron.job's row security)" "f" tle_intruder tle_db \
  "SELECT EXISTS (SELECT FROM cron.job WHERE jobid = '$job')"
expect "the owner unschedules it (idem_unschedule_reaper)" "t
0" tle_owner tle_db "SELECT idem_unschedule_reaper(); SELECT count(*) FROM cron.job"

runs "the owner drops the extension and creates it again" tle_owner tle_db \
  -c "DROP EXTENSION idempotency" -c "CREATE EXTENSION idempotency"
expect "created again at the default version $B, the SQL edition, a fresh claim" "$B|sql
claimed|t" tle_owner tle_db \
  "SELECT extversion, idem_edition() FROM pg_extension WHERE extname = 'idempotency';
   SELECT outcome, inserted FROM idem_claim('pay-1', request => '{\"a\": 1}')"

# The record of row-level security (docs/contract.md §13): pg_dump leaves out an extension
# table's policies and flags, so the owner records them (idem_row_security_record()) and a
# restore puts them back from the record's rows. A tenant can neither read, change nor erase the
# record, nor make the functions change it. In databases of their own (tle_db has pg_cron, which
# lives in one database only).
if ! setup=$(as postgres postgres -c "CREATE ROLE tle_tenant LOGIN" \
      -c "CREATE DATABASE tle_rls OWNER tle_owner" -c "CREATE DATABASE tle_rls_restored OWNER tle_owner" 2>&1 &&
    as postgres tle_rls -c "CREATE EXTENSION pg_tle" 2>&1 &&
    as tle_admin tle_rls -f "$fresh" 2>&1 && as tle_owner tle_rls -c "CREATE EXTENSION idempotency" 2>&1); then
  not_ok "roles, databases, pg_tle and the extension for the record of row-level security" "$setup"; summary; exit 1
fi
runs "the owner confines the tenants to their scope (row-level security, a policy) and claims a key in each" \
  tle_owner tle_rls \
  -c "GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO tle_tenant, tle_intruder" \
  -c "ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY" \
  -c "CREATE POLICY own_scope ON idem_keys TO tle_tenant, tle_intruder
        USING (scope = current_user) WITH CHECK (scope = current_user)" \
  -c "SELECT count(*) FROM idem_claim('k', '{}', 'tle_tenant')" -c "SELECT count(*) FROM idem_claim('k', '{}', 'tle_intruder')"
expect "idem_row_security_check() is true while nothing is recorded" t tle_owner tle_rls "SELECT idem_row_security_check()"
expect "the owner records them: one policy (idem_row_security_record)" 1 tle_owner tle_rls \
  "SELECT idem_row_security_record()"
expect "... the flags and the policy, its expressions schema-qualified" \
  't|f
own_scope|ALL|{tle_intruder,tle_tenant}|(scope = CURRENT_USER)|(scope = CURRENT_USER)' \
  tle_owner tle_rls "SELECT enabled, forced FROM idem_row_security;
                     SELECT name, command, roles, using_expr, check_expr FROM idem_policies"
expect "a tenant sees its own scope's key only" "tle_intruder" tle_intruder tle_rls "SELECT string_agg(scope, ',') FROM idem_keys"
refused "a tenant cannot read the record" 42501 tle_intruder tle_rls -c "SELECT * FROM idem_policies"
refused "... nor write it" 42501 tle_intruder tle_rls \
  -c "INSERT INTO idem_policies VALUES ('all', true, 'ALL', '{public}', 'true', 'true', NULL)"
refused "... nor erase it (TRUNCATE)" 42501 tle_intruder tle_rls -c "TRUNCATE idem_row_security"
refused "... (DELETE)" 42501 tle_intruder tle_rls -c "DELETE FROM idem_policies"
refused "... nor record what idem_keys has (idem_row_security_record)" 42501 tle_intruder tle_rls \
  -c "SELECT idem_row_security_record()"
refused "... nor apply the record (idem_row_security_apply)" 42501 tle_intruder tle_rls \
  -c "SELECT idem_row_security_apply()"
refused "... nor take row-level security off idem_keys" 42501 tle_intruder tle_rls \
  -c "ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY"
runs "the owner grants a tenant DELETE and INSERT on the record by mistake" tle_owner tle_rls \
  -c "GRANT DELETE, INSERT ON idem_policies, idem_row_security TO tle_intruder"
refused "... the tenant's write is still refused (the record's trigger)" 42501 tle_intruder tle_rls \
  -c "DELETE FROM idem_policies"
refused "... and so is its erasing of the flags" 42501 tle_intruder tle_rls -c "DELETE FROM idem_row_security"
runs "... the owner revokes it" tle_owner tle_rls -c "REVOKE DELETE, INSERT ON idem_policies, idem_row_security FROM tle_intruder"
expect "the record and the policy are as they were" "1|1|t|own_scope" tle_owner tle_rls \
  "SELECT (SELECT count(*) FROM idem_policies), (SELECT count(*) FROM idem_row_security),
          relrowsecurity, (SELECT string_agg(polname, ',') FROM pg_policy WHERE polrelid = 'idem_keys'::regclass)
     FROM pg_class WHERE oid = 'idem_keys'::regclass"
runs "the owner drops the policy" tle_owner tle_rls -c "DROP POLICY own_scope ON idem_keys"
refused "... idem_row_security_check() says the recorded policy is missing (IK006)" IK006 tle_owner tle_rls \
  -c "SELECT idem_row_security_check()"
expect "... idem_row_security_apply() puts it back" "1
own_scope|t" tle_owner tle_rls \
  "SELECT idem_row_security_apply();
   SELECT string_agg(polname, ','), idem_row_security_check() FROM pg_policy WHERE polrelid = 'idem_keys'::regclass"

# a record idem_keys cannot be made to match: a WARNING (the write goes on), idem_keys as it was
warned() { # NAME PATTERN ROLE DB ARG...: runs, and its output has a WARNING matching PATTERN
  local name=$1 pattern=$2 got; shift 2
  if got=$(as "$@" 2>&1) && grep -Eq "WARNING:  $pattern" <<<"$got"; then ok "$name"; else not_ok "$name" "$got"; fi
}
warned "a recorded policy naming a role the cluster lacks: a WARNING (42704), not an error" \
  '42704: row-level security of idem_keys was not restored: role "no_such_role" does not exist' \
  tle_owner tle_rls -c "UPDATE idem_policies SET roles = '{no_such_role}'"
warned "a recorded policy whose named objects are not those it names now: a WARNING (IK006)" \
  'IK006: row-level security of idem_keys was not restored: policy "own_scope" of idem_keys names objects other than those recorded' \
  tle_owner tle_rls -c "UPDATE idem_policies SET roles = '{tle_intruder,tle_tenant}', named = 'function public.f() owned by x'"
expect "... idem_keys kept its policy and roles meanwhile; the owner records them again" "own_scope|{tle_intruder,tle_tenant}
1" tle_owner tle_rls \
  "SELECT polname, polroles::regrole[]::text[] FROM pg_policy WHERE polrelid = 'idem_keys'::regclass;
   SELECT idem_row_security_record()"

# A record written to run more than a policy when a superuser applies it (or restores it): the
# owner is no superuser, and stays none.
planted="true); ALTER ROLE tle_owner SUPERUSER; CREATE POLICY planted ON public.idem_keys USING (true"
warned "the owner plants statements in a recorded expression: its trigger refuses the policy (IK006)" \
  'IK006: row-level security of idem_keys was not restored: policy "own_scope" of idem_keys is not re-created: its record is not one policy' \
  tle_owner tle_rls -c "UPDATE idem_policies SET using_expr = \$\$$planted\$\$"
refused "... a superuser's idem_row_security_apply() refuses it" IK006 postgres tle_rls -c "SELECT idem_row_security_apply()"
runs "the owner drops the record's CHECK and plants them in the command" tle_owner tle_rls \
  -c "ALTER TABLE idem_policies DROP CONSTRAINT idem_policies_command_check" \
  -c "UPDATE idem_policies SET using_expr = NULL, command = 'ALL TO PUBLIC; ALTER ROLE tle_owner SUPERUSER; SELECT'"
refused "... a superuser's idem_row_security_apply() refuses that too" IK006 postgres tle_rls -c "SELECT idem_row_security_apply()"
expect "... no statement of them ran: the owner is no superuser, no policy was added" "f|own_scope" postgres tle_rls \
  "SELECT rolsuper, (SELECT string_agg(polname, ',') FROM pg_policy WHERE polrelid = 'idem_keys'::regclass)
     FROM pg_roles WHERE rolname = 'tle_owner'"
runs "the owner records what idem_keys has again" tle_owner tle_rls -c "SELECT idem_row_security_record()"

dump=$(mktemp)
if out=$("$PGBIN/pg_dump" -U postgres -d tle_rls -f "$dump" 2>&1); then ok "pg_dump of the database"; else not_ok "pg_dump of the database" "$out"; fi
expect "the dump has no policy of idem_keys of its own (pg_dump leaves them out), the record's rows only" "0|2" \
  postgres postgres "SELECT $(grep -c '^CREATE POLICY' "$dump"), $(grep -Ec '^COPY public\.idem_(policies|row_security) ' "$dump")"
out=$(as postgres tle_rls_restored -f "$dump" 2>&1)
if [ $? -eq 0 ] && ! grep -Eq 'ERROR|WARNING' <<<"$out"; then
  ok "restored into a fresh database (psql -f, as pg_tle's own dump test does)"
else
  not_ok "restored into a fresh database" "$out"
fi
rm -f "$dump"
# the restore's CREATE EXTENSION makes the restoring role (here a superuser) the extension's owner
expect "the restored idem_keys has its row-level security and policy back" \
  "t|f|own_scope|{tle_intruder,tle_tenant}|(scope = CURRENT_USER)|t" postgres tle_rls_restored \
  "SELECT c.relrowsecurity, c.relforcerowsecurity, p.polname, p.polroles::regrole[]::text[],
          pg_get_expr(p.polqual, p.polrelid), idem_row_security_check()
     FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid WHERE c.oid = 'idem_keys'::regclass"
expect "... a tenant sees its own scope's key only" "tle_tenant" tle_tenant tle_rls_restored \
  "SELECT string_agg(scope, ',') FROM idem_keys"
refused "... and cannot claim in another's scope" 42501 tle_tenant tle_rls_restored \
  -c "SELECT * FROM idem_claim('k', '{}', 'tle_intruder')"

# A record the restore cannot apply (a role the cluster lacks): closed, not open. There is no
# IK006 at each call in the SQL edition, so the restore turns row-level security on without the
# policies: a tenant sees no key instead of every tenant's.
if ! setup=$(as postgres postgres -c "CREATE DATABASE tle_closed OWNER tle_owner" 2>&1 &&
    as postgres tle_closed -c "CREATE EXTENSION pg_tle" 2>&1 &&
    as tle_admin tle_closed -f "$fresh" 2>&1 && as tle_owner tle_closed -c "CREATE EXTENSION idempotency" 2>&1); then
  not_ok "a database for the record that cannot be applied" "$setup"; summary; exit 1
fi
runs "the owner grants a tenant the keys and stores a key of another scope" tle_owner tle_closed \
  -c "GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO tle_tenant" \
  -c "SELECT count(*) FROM idem_claim('k', '{}', 'other')" -c "SELECT idem_complete('k', '{\"secret\": 1}', scope => 'other')"
warned "the record's rows are loaded as a restore loads them, naming a role the cluster lacks: a WARNING" \
  '42704: row-level security of idem_keys was not restored: role "no_such_role" does not exist' tle_owner tle_closed \
  -c "INSERT INTO idem_policies VALUES ('own_scope', true, 'ALL', '{no_such_role}', '(scope = CURRENT_USER)', NULL, NULL)" \
  -c "INSERT INTO idem_row_security (enabled, forced) VALUES (true, false)"
expect "... row-level security is on, with no policy" "t|0" tle_owner tle_closed \
  "SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid = 'idem_keys'::regclass)
     FROM pg_class WHERE oid = 'idem_keys'::regclass"
expect "... the tenant sees no key, and is shown no other scope's response" "0|" tle_tenant tle_closed \
  "SELECT count(*), (SELECT (idem_lookup('k', scope => 'other')).response::text) FROM idem_keys"

summary
