#include "access/policypath.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idem {

// Every statement returns the columns in Column order, then xmin, then the whole row.
static const char *const returned =
    "t.scope, t.key, t.state, t.attempt, t.fingerprint, t.response, t.response_code, t.retryable, "
    "t.created_at, t.locked_until, t.completed_at, t.expires_at, t.xmin, t";

void
policy_begin(PolicySql *ps, const Catalog *catalog)
{
	ps->catalog = catalog;
	ps->caller = CurrentMemoryContext;
	const char *schema = get_namespace_name(catalog->namespace_oid);
	ps->table = quote_qualified_identifier(schema, "idem_keys");
	ps->state_type = quote_qualified_identifier(schema, "idem_state");
	ps->guc_nest_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
	                         GUC_ACTION_SAVE, true, 0, false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idempotency: SPI_connect failed");
}

void
policy_end(PolicySql *ps)
{
	SPI_finish();
	AtEOXact_GUC(true, ps->guc_nest_level);
}

static void
run(const char *sql, int nargs, Oid *types, Datum *values, const bool *isnull, int expected)
{
	char nulls[32];
	for (int i = 0; i < nargs; i++)
		nulls[i] = isnull[i] ? 'n' : ' ';
	int rc = SPI_execute_with_args(sql, nargs, types, values, nulls, false, 0);
	if (rc != expected)
		elog(ERROR, "idempotency: SPI_execute_with_args returned %d", rc);
}

// Copies the first result row into the caller's memory.
static bool
first_row(PolicySql *ps, KeyRow *out, TransactionId *xmin, Datum *whole)
{
	if (SPI_processed == 0)
		return false;
	HeapTuple tuple = SPI_tuptable->vals[0];
	TupleDesc desc = SPI_tuptable->tupdesc;
	MemoryContext old = MemoryContextSwitchTo(ps->caller);
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		Datum value = SPI_getbinval(tuple, desc, c + 1, &out->isnull[c]);
		out->value[c] = out->isnull[c] ? (Datum) 0
		                               : datumCopy(value, ps->catalog->typbyval[c], ps->catalog->typlen[c]);
	}
	bool isnull;
	if (xmin != nullptr)
		*xmin = DatumGetTransactionId(SPI_getbinval(tuple, desc, NUM_COLUMNS + 1, &isnull));
	if (whole != nullptr)
		*whole = datumCopy(SPI_getbinval(tuple, desc, NUM_COLUMNS + 2, &isnull), false, -1);
	MemoryContextSwitchTo(old);
	return true;
}

static void
column_args(const PolicySql *ps, const KeyRow *row, Oid *types, Datum *values, bool *isnull)
{
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		types[c] = ps->catalog->type[c];
		values[c] = row->value[c];
		isnull[c] = row->isnull[c];
	}
}

bool
policy_insert(PolicySql *ps, const KeyRow *row, KeyRow *out, Datum *whole)
{
	char *sql = psprintf("INSERT INTO %s AS t (scope, key, state, attempt, fingerprint, response, "
	                     "response_code, retryable, created_at, locked_until, completed_at, expires_at) "
	                     "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) "
	                     "ON CONFLICT (scope, key) DO NOTHING RETURNING %s",
	                     ps->table, returned);
	Oid types[NUM_COLUMNS];
	Datum values[NUM_COLUMNS];
	bool isnull[NUM_COLUMNS];
	column_args(ps, row, types, values, isnull);
	run(sql, NUM_COLUMNS, types, values, isnull, SPI_OK_INSERT_RETURNING);
	return first_row(ps, out, nullptr, whole);
}

bool
policy_fetch(PolicySql *ps, Datum scope, Datum key, bool lock, KeyRow *out, TransactionId *xmin,
             Datum *whole)
{
	char *sql = psprintf("SELECT %s FROM %s AS t WHERE t.scope = $1 AND t.key = $2%s", returned,
	                     ps->table, lock ? " FOR NO KEY UPDATE" : "");
	Oid types[2] = {TEXTOID, TEXTOID};
	Datum values[2] = {scope, key};
	bool isnull[2] = {false, false};
	run(sql, 2, types, values, isnull, SPI_OK_SELECT);
	return first_row(ps, out, xmin, whole);
}

bool
policy_update(PolicySql *ps, const KeyRow *old, const KeyRow *row, KeyRow *out, Datum *whole)
{
	char *sql = psprintf("UPDATE %s AS t SET state = $3, attempt = $4, fingerprint = $5, "
	                     "response = $6, response_code = $7, retryable = $8, created_at = $9, "
	                     "locked_until = $10, completed_at = $11, expires_at = $12 "
	                     "WHERE t.scope = $1 AND t.key = $2 AND t.attempt = $13 AND t.state = $14 "
	                     "RETURNING %s",
	                     ps->table, returned);
	Oid types[NUM_COLUMNS + 2];
	Datum values[NUM_COLUMNS + 2];
	bool isnull[NUM_COLUMNS + 2];
	column_args(ps, row, types, values, isnull);
	// Attempt and state together name the version: every transition changes one of them.
	types[NUM_COLUMNS] = INT4OID;
	values[NUM_COLUMNS] = old->value[COL_ATTEMPT];
	isnull[NUM_COLUMNS] = false;
	types[NUM_COLUMNS + 1] = ps->catalog->type[COL_STATE];
	values[NUM_COLUMNS + 1] = old->value[COL_STATE];
	isnull[NUM_COLUMNS + 1] = false;
	run(sql, NUM_COLUMNS + 2, types, values, isnull, SPI_OK_UPDATE_RETURNING);
	return first_row(ps, out, nullptr, whole);
}

int64
policy_reap(PolicySql *ps, TimestampTz now, int32 max_rows)
{
	char *sql = psprintf("DELETE FROM %s AS t WHERE t.ctid = ANY (ARRAY("
	                     "SELECT s.ctid FROM %s AS s WHERE s.expires_at <= $1 "
	                     "AND NOT (s.state = 'pending'::%s AND coalesce(s.locked_until > $1, false)) "
	                     "ORDER BY s.expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
	                     ps->table, ps->table, ps->state_type);
	Oid types[2] = {TIMESTAMPTZOID, INT4OID};
	Datum values[2] = {TimestampTzGetDatum(now), Int32GetDatum(max_rows)};
	bool isnull[2] = {false, false};
	run(sql, 2, types, values, isnull, SPI_OK_DELETE);
	return (int64) SPI_processed;
}

} // namespace idem
