# Helpers of the install-route tests (sourced): checks counted into PASS/FAIL, psql as a role.
# Needs PGBIN and the libpq environment of the cluster (PGHOST, PGPORT).
PASS=0 FAIL=0

ok() { PASS=$((PASS + 1)); echo "ok - $1"; }
not_ok() { # NAME DETAIL...
  FAIL=$((FAIL + 1)); echo "not ok - $1"; shift
  local line; for line in "$@"; do printf '    %s\n' "$line"; done
}

# psql as ROLE in DB; the rest are psql's arguments (-c SQL or -f FILE). Errors carry their
# SQLSTATE ("ERROR:  42501: ...").
as() { # ROLE DB ARG...
  local role=$1 db=$2; shift 2
  "$PGBIN/psql" -X -At -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -U "$role" -d "$db" "$@"
}

# NAME EXPECTED ROLE DB SQL: the query's output (-At) is EXPECTED
expect() {
  local got
  got=$(as "$3" "$4" -c "$5" 2>&1)
  if [ "$got" = "$2" ]; then ok "$1"; else not_ok "$1" "expected: $2" "got: $got"; fi
}

# NAME ROLE DB ARG...: runs without an error
runs() {
  local name=$1 got; shift
  if got=$(as "$@" 2>&1); then ok "$name"; else not_ok "$name" "$got"; fi
}

# NAME SQLSTATE ROLE DB ARG...: fails with SQLSTATE
refused() {
  local name=$1 state=$2 got; shift 2
  if got=$(as "$@" 2>&1); then
    not_ok "$name" "expected an error $state, it ran: $got"
  elif grep -q "ERROR:  $state:" <<<"$got"; then
    ok "$name"
  else
    not_ok "$name" "expected SQLSTATE $state, got: $got"
  fi
}

summary() { echo "$PASS passed, $FAIL failed"; }

# A query of the digest of the SQL edition's objects in SCHEMA: every function's definition and
# privileges, every relation's kind, view definition, options and privileges, every type. Two
# databases with the same digest have the same SQL edition in that schema.
catalog_of() { # SCHEMA
  echo "SELECT md5(string_agg(d, E'\\n' ORDER BY d)) FROM (
          SELECT pg_get_functiondef(p.oid) || coalesce(p.proacl::text, '') AS d
            FROM pg_proc p WHERE p.pronamespace = '$1'::regnamespace
          UNION ALL
          SELECT concat_ws(':', c.relname, c.relkind, pg_get_viewdef(c.oid), c.reloptions, c.relacl)
            FROM pg_class c WHERE c.relnamespace = '$1'::regnamespace
          UNION ALL
          SELECT t.typname FROM pg_type t WHERE t.typnamespace = '$1'::regnamespace) o"
}
