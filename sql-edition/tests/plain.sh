#!/usr/bin/env bash
# The plain-SQL route (providers without pg_tle): the generated file for `psql -f`, run by the
# database's owner (not a superuser) into a schema of its own, against a running cluster with no
# file of the C edition (sql-edition/tests/routes starts it).
#
#   plain.sh OUT DENIED OLD   OUT: sql-edition/build OUT --schema idem;
#                             DENIED: sql-edition/build DENIED --schema idem_denied;
#                             OLD: sql-edition/build OLD --schema idem --release VERSION, the
#                             newest released version
#
# Run twice (the second run changes nothing); the version table; idem_edition() and a claim
# cycle; a role without CREATE on the database fails cleanly and leaves nothing behind; an
# intruder cannot change the installed functions; row-level security of idem_keys moves with
# pg_dump (no extension owns the table). The update: the released version installed in
# another database, then the update file run twice gives what a fresh install gives. Last line:
# "N passed, N failed".
set -uo pipefail
OUT=$1 DENIED=$2 OLD=$3
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

file=$(ls "$OUT"/plain/idempotency-*.sql)
denied=$(ls "$DENIED"/plain/idempotency-*.sql)
old_file=$(ls "$OLD"/plain/idempotency-*.sql)
V=$(basename "$file" .sql); V=${V#idempotency-}
A=$(basename "$old_file" .sql); A=${A#idempotency-}
update=$OUT/plain/update/idempotency-$A--$V.sql

if ! setup=$(as postgres postgres -c "CREATE ROLE plain_owner LOGIN" -c "CREATE ROLE plain_intruder LOGIN" \
      -c "CREATE ROLE plain_app LOGIN" \
      -c "CREATE DATABASE plain_db OWNER plain_owner" -c "CREATE DATABASE plain_up OWNER plain_owner" \
      -c "CREATE DATABASE plain_fresh OWNER plain_owner" 2>&1); then
  not_ok "roles and database" "$setup"; summary; exit 1
fi

objects="SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = 'idem'::regnamespace)
             || '/' || (SELECT count(*) FROM pg_class WHERE relnamespace = 'idem'::regnamespace)
             || '/' || (SELECT count(*) FROM idem.idem_sql_version)"
expect "the owner is no superuser" f plain_owner plain_db "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
runs "the database owner runs the generated file (psql -f)" plain_owner plain_db -f "$file"
first=$(as plain_owner plain_db -c "$objects" 2>&1)
expect "the version table says $V" "$V" plain_owner plain_db "SELECT version FROM idem.idem_sql_version"
runs "... and runs it again" plain_owner plain_db -f "$file"
expect "the second run changed nothing (functions/relations/version rows: $first)" "$first" \
  plain_owner plain_db "$objects"
expect "idem.idem_edition() answers sql" sql plain_owner plain_db "SELECT idem.idem_edition()"
expect "a claim cycle: claimed, succeeded, replay of the response" "claimed|t
succeeded|201
replay|{\"id\": 1}|201" plain_owner plain_db \
  "SET search_path = idem;
   SELECT outcome, inserted FROM idem_claim('pay-1', request => '{\"a\": 1}');
   SELECT state, response_code FROM idem_complete('pay-1', '{\"id\": 1}', 201);
   SELECT outcome, response, response_code FROM idem_claim('pay-1', request => '{\"a\": 1}')"

# the application, given the schema and the keys as managed.md says: it reads the version (the
# client libraries look for the install there) and cannot change it
runs "the owner grants the application the schema and the keys" plain_owner plain_db \
  -c "GRANT USAGE ON SCHEMA idem TO plain_app" \
  -c "GRANT SELECT, INSERT, UPDATE, DELETE ON idem.idem_keys TO plain_app"
expect "the application reads the version table" "$V" plain_app plain_db "SELECT version FROM idem.idem_sql_version"
refused "... and cannot change it" 42501 plain_app plain_db -c "UPDATE idem.idem_sql_version SET version = '0'"

expect "the intruder has no CREATE on the database" f plain_intruder plain_db \
  "SELECT has_database_privilege('plain_db', 'CREATE')"
refused "a role without CREATE on the database: the file fails" 42501 plain_intruder plain_db -f "$denied"
expect "... and leaves nothing behind" "0" postgres plain_db \
  "SELECT count(*) FROM pg_namespace WHERE nspname = 'idem_denied'"
refused "an intruder cannot replace an installed function" 42501 plain_intruder plain_db \
  -c "CREATE OR REPLACE FUNCTION idem.idem_edition() RETURNS text LANGUAGE sql AS \$\$SELECT 'c'\$\$"
refused "... nor change the version table" 42501 plain_intruder plain_db \
  -c "UPDATE idem.idem_sql_version SET version = '0'"
refused "... nor read the keys" 42501 plain_intruder plain_db -c "SELECT count(*) FROM idem.idem_keys"
expect "still the SQL edition at $V" "sql|$V" plain_owner plain_db \
  "SELECT idem.idem_edition(), version FROM idem.idem_sql_version"

# idem_keys is an ordinary table here, not an extension's: pg_dump dumps its row-level security
# with it, and a restore puts it back
runs "the owner confines the application to its tenant's keys (row-level security, forced)" plain_owner plain_db \
  -c "ALTER TABLE idem.idem_keys ENABLE ROW LEVEL SECURITY" -c "ALTER TABLE idem.idem_keys FORCE ROW LEVEL SECURITY" \
  -c "CREATE POLICY tenant_a ON idem.idem_keys TO plain_app USING (scope = 'a') WITH CHECK (scope = 'a')"
dump=$(mktemp)
if out=$("$PGBIN/pg_dump" -U postgres -d plain_db --no-owner -f "$dump" 2>&1 &&
         as postgres postgres -c "CREATE DATABASE plain_restored OWNER plain_owner" 2>&1 &&
         as plain_owner plain_restored -f "$dump" 2>&1); then
  ok "pg_dump of the database (forced row-level security: by a role that bypasses it), restored by the owner into another"
else
  not_ok "pg_dump of the database (forced row-level security: by a role that bypasses it), restored by the owner into another" "$out"
fi
rm -f "$dump"
expect "the restored idem_keys has its row-level security, forced, and its policy" \
  "t|t|tenant_a|{plain_app}|(scope = 'a'::text)" plain_owner plain_restored \
  "SELECT c.relrowsecurity, c.relforcerowsecurity, p.policyname, p.roles, p.qual
     FROM pg_class c JOIN pg_policies p ON p.schemaname = 'idem' AND p.tablename = c.relname
    WHERE c.oid = 'idem.idem_keys'::regclass"

# the update from the released version, in a database of its own, against a fresh install in
# another one
runs "the owner installs $V afresh in a third database" plain_owner plain_fresh -f "$file"
fresh=$(as plain_owner plain_fresh -c "$(catalog_of idem)" 2>&1)
runs "the owner installs the released $A" plain_owner plain_up -f "$old_file"
expect "... at $A, where a key is claimed and completed" "$A
claimed
succeeded" plain_owner plain_up \
  "SELECT version FROM idem.idem_sql_version;
   SELECT outcome FROM idem.idem_claim('pay-1', request => '{\"a\": 1}');
   SELECT state FROM idem.idem_complete('pay-1', '{\"id\": 1}', 201)"
refused "the intruder cannot run the update" 42501 plain_intruder plain_up -f "$update"
runs "the owner runs the update file from $A to $V (psql -f)" plain_owner plain_up -f "$update"
expect "the version table says $V" "$V" plain_owner plain_up "SELECT version FROM idem.idem_sql_version"
expect "the updated schema is a fresh install's: the same objects, definitions and privileges" \
  "$fresh" plain_owner plain_up "$(catalog_of idem)"
second=$(as plain_owner plain_up -f "$update" 2>&1)
if [ "$second" = "idempotency is already at $V in schema idem" ]; then
  ok "run again, the update says it is done and changes nothing"
else
  not_ok "run again, the update says it is done and changes nothing" "$second"
fi
expect "... still a fresh install's schema" "$fresh" plain_owner plain_up "$(catalog_of idem)"
expect "the key completed before the update replays after it" "replay|{\"id\": 1}" plain_owner plain_up \
  "SELECT outcome, response FROM idem.idem_claim('pay-1', request => '{\"a\": 1}')"
runs "the install file run on the updated schema changes nothing" plain_owner plain_up -f "$file"
expect "... still $V" "$V" plain_owner plain_up "SELECT version FROM idem.idem_sql_version"

summary
