#include "access/policypath.hpp"

extern "C" {
#include "executor/spi.h"
#include "lib/stringinfo.h"
}

namespace idem {

// Every statement returns the columns in Column order (NULL for a 1.2 column that a 1.1 table
// lacks), then xmin, then the whole row.
static const char *
returned(const Catalog *c)
{
	StringInfoData sql;
	initStringInfo(&sql);
	for (int col = 0; col < NUM_COLUMNS; col++)
	{
		if (c->attnum[col] == InvalidAttrNumber)
			appendStringInfoString(&sql, "NULL, ");
		else
			appendStringInfo(&sql, "t.%s, ", column_names[col]);
	}
	appendStringInfoString(&sql, "t.xmin, t");
	return sql.data;
}

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
	char nulls[32] = {};
	Assert(nargs <= (int) sizeof(nulls));
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

// The row's values as parameters $1.. in Column order, for the columns the table has; their count.
static int
column_args(const PolicySql *ps, const KeyRow *row, Oid *types, Datum *values, bool *isnull)
{
	int n = 0;
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		if (ps->catalog->attnum[c] == InvalidAttrNumber)
			continue;
		types[n] = ps->catalog->type[c];
		values[n] = row->value[c];
		isnull[n] = row->isnull[c];
		n++;
	}
	return n;
}

bool
policy_insert(PolicySql *ps, const KeyRow *row, KeyRow *out, Datum *whole)
{
	StringInfoData names, params;
	initStringInfo(&names);
	initStringInfo(&params);
	int n = 0;
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		if (ps->catalog->attnum[c] == InvalidAttrNumber)
			continue;
		n++;
		appendStringInfo(&names, "%s%s", n > 1 ? ", " : "", column_names[c]);
		appendStringInfo(&params, "%s$%d", n > 1 ? ", " : "", n);
	}
	char *sql = psprintf("INSERT INTO %s AS t (%s) VALUES (%s) "
	                     "ON CONFLICT (scope, key) DO NOTHING RETURNING %s",
	                     ps->table, names.data, params.data, returned(ps->catalog));
	Oid types[NUM_COLUMNS];
	Datum values[NUM_COLUMNS];
	bool isnull[NUM_COLUMNS];
	int nargs = column_args(ps, row, types, values, isnull);
	run(sql, nargs, types, values, isnull, SPI_OK_INSERT_RETURNING);
	return first_row(ps, out, nullptr, whole);
}

bool
policy_fetch(PolicySql *ps, Datum scope, Datum key, bool lock, KeyRow *out, TransactionId *xmin,
             Datum *whole)
{
	char *sql = psprintf("SELECT %s FROM %s AS t WHERE t.scope = $1 AND t.key = $2%s",
	                     returned(ps->catalog), ps->table, lock ? " FOR NO KEY UPDATE" : "");
	Oid types[2] = {TEXTOID, TEXTOID};
	Datum values[2] = {scope, key};
	bool isnull[2] = {false, false};
	run(sql, 2, types, values, isnull, SPI_OK_SELECT);
	return first_row(ps, out, xmin, whole);
}

bool
policy_update(PolicySql *ps, const KeyRow *old, const KeyRow *row, KeyRow *out, Datum *whole)
{
	// $1, $2: scope and key, never changed; the other columns the table has follow.
	StringInfoData set;
	initStringInfo(&set);
	int n = 0;
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		if (ps->catalog->attnum[c] == InvalidAttrNumber)
			continue;
		n++;
		if (c != COL_SCOPE && c != COL_KEY)
			appendStringInfo(&set, "%s%s = $%d", set.len > 0 ? ", " : "", column_names[c], n);
	}
	// Attempt, state and lease end together name the version: every transition changes one of
	// them (an expired key claimed anew keeps attempt 1 and pending, but gets a new lease).
	char *sql = psprintf("UPDATE %s AS t SET %s "
	                     "WHERE t.scope = $1 AND t.key = $2 AND t.attempt = $%d AND t.state = $%d "
	                     "AND t.locked_until IS NOT DISTINCT FROM $%d RETURNING %s",
	                     ps->table, set.data, n + 1, n + 2, n + 3, returned(ps->catalog));
	Oid types[NUM_COLUMNS + 3];
	Datum values[NUM_COLUMNS + 3];
	bool isnull[NUM_COLUMNS + 3];
	int nargs = column_args(ps, row, types, values, isnull);
	types[nargs] = INT4OID;
	values[nargs] = old->value[COL_ATTEMPT];
	isnull[nargs] = false;
	types[nargs + 1] = ps->catalog->type[COL_STATE];
	values[nargs + 1] = old->value[COL_STATE];
	isnull[nargs + 1] = false;
	types[nargs + 2] = TIMESTAMPTZOID;
	values[nargs + 2] = old->value[COL_LOCKED_UNTIL];
	isnull[nargs + 2] = old->isnull[COL_LOCKED_UNTIL];
	run(sql, nargs + 3, types, values, isnull, SPI_OK_UPDATE_RETURNING);
	return first_row(ps, out, nullptr, whole);
}

bool
policy_delete(PolicySql *ps, const KeyRow *old)
{
	char *sql = psprintf("DELETE FROM %s AS t "
	                     "WHERE t.scope = $1 AND t.key = $2 AND t.attempt = $3 AND t.state = $4",
	                     ps->table);
	Oid types[4] = {TEXTOID, TEXTOID, INT4OID, ps->catalog->type[COL_STATE]};
	Datum values[4] = {old->value[COL_SCOPE], old->value[COL_KEY], old->value[COL_ATTEMPT],
	                   old->value[COL_STATE]};
	bool isnull[4] = {false, false, false, false};
	run(sql, 4, types, values, isnull, SPI_OK_DELETE);
	return SPI_processed > 0;
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

Found
policy_probe_until(const Catalog *catalog, Datum scope, Datum key, TimestampTz deadline)
{
	KeyTable kt;
	memset(&kt, 0, sizeof(kt));
	kt.catalog = *catalog;
	// The lock the SQL path's INSERT takes next: no upgrade.
	kt.lockmode = RowExclusiveLock;
	kt.rel = table_open(catalog->relid, kt.lockmode);
	kt.pkey = index_open(catalog->pkey_oid, kt.lockmode);
	kt.found = table_slot_create(kt.rel, nullptr);
	Found found = keytable_find_latest_until(&kt, scope, key, deadline);
	keytable_close(&kt);
	return found;
}

} // namespace idem
