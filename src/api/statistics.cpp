// The SQL-callable functions of the statistics views: idem_stats (docs/contract.md §2) and
// idem_scope_stats (docs/contract.md §10), read from stats/dbstats and stats/scopestats.
#include "access/catalog.hpp"
#include "access/rowsecurity.hpp"
#include "common/guard.hpp"
#include "common/preload.hpp"
#include "stats/dbstats.hpp"
#include "stats/scopestats.hpp"

extern "C" {
#include "catalog/pg_authid.h"
}

using namespace idem;

static constexpr int num_counters = static_cast<int>(Counter::count);

// The counters of idem_stats, in its column order; then last_reap_at and stats_reset.
static constexpr Counter idem_stats_counters[] = {
	Counter::claims,    Counter::inserted, Counter::replays, Counter::in_progress,
	Counter::takeovers, Counter::mismatches, Counter::completes, Counter::fails,
	Counter::reaped,    Counter::reaper_runs};
static constexpr int idem_stats_columns = lengthof(idem_stats_counters) + 2;

// idem_stats_get(): the row of the idem_stats view for the current database.
IDEM_SQL_FUNCTION(idem_stats_get)
{
	TupleDesc desc;
	if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
		                errmsg("function returning record called in context that cannot accept type record")));
	desc = BlessTupleDesc(desc);
	if (desc->natts != idem_stats_columns)
		elog(ERROR, "idempotency: idem_stats_get() must return %d columns", idem_stats_columns);

	Datum values[idem_stats_columns];
	bool nulls[idem_stats_columns];
	uint64 total[num_counters];
	bool counted = db_stats_counts(total);
	if (!counted)
		preload_notice_if_missing();
	int col = 0;
	for (Counter c : idem_stats_counters)
	{
		nulls[col] = !counted;
		values[col++] = counted ? Int64GetDatum(static_cast<int64>(total[static_cast<int>(c)])) : (Datum) 0;
	}
	TimestampTz times[2];
	bool known[2] = {db_stats_last_reap_at(&times[0]), db_stats_reset_at(&times[1])};
	for (int i = 0; i < 2; i++)
	{
		nulls[col] = !known[i];
		values[col++] = known[i] ? TimestampTzGetDatum(times[i]) : (Datum) 0;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

// idem_stats_dealloc(): idem_stats' dealloc column (1.3), NULL without shared memory.
IDEM_SQL_FUNCTION(idem_stats_dealloc)
{
	uint64 total[num_counters];
	if (!db_stats_counts(total))
		PG_RETURN_NULL();
	PG_RETURN_INT64(static_cast<int64>(total[static_cast<int>(Counter::dealloc)]));
}

// idem_stats_reset(): zero this database's counters (nothing to do without shared memory).
IDEM_SQL_FUNCTION(idem_stats_reset)
{
	db_stats_reset();
	PG_RETURN_VOID();
}

// Whether the current user may see every scope's row: pg_read_all_stats, or SELECT on
// idem_keys.scope without row-level security hiding rows (a tenant role that policies confine
// to its own rows must not learn the other tenants' scope names here).
static bool
sees_all_scopes()
{
	Oid user = GetUserId();
	if (has_privs_of_role(user, ROLE_PG_READ_ALL_STATS))
		return true;
	const Catalog *c = catalog_get();
	Oid relid = c->relid;
	AttrNumber scope_att = c->attnum[COL_SCOPE];
	bool reads_scope = pg_class_aclcheck(relid, user, ACL_SELECT) == ACLCHECK_OK ||
	                   pg_attribute_aclcheck(relid, scope_att, user, ACL_SELECT) == ACLCHECK_OK;
	// A role the recorded row-level security would confine sees nothing while it is not in force.
	return reads_scope && check_enable_rls(relid, InvalidOid, true) != RLS_ENABLED &&
	       !rowsecurity_missing_for_keys();
}

static constexpr int scope_stats_columns = 1 + scope_counter_count + 3;

static void
put_scope_row(void *arg, const ScopeRow *row)
{
	ReturnSetInfo *rsinfo = static_cast<ReturnSetInfo *>(arg);
	Datum values[scope_stats_columns];
	bool nulls[scope_stats_columns] = {};
	int col = 0;
	values[col++] = PointerGetDatum(cstring_to_text_with_len(row->scope, row->len));
	for (int c = 0; c < scope_counter_count; c++)
		values[col++] = Int64GetDatum(static_cast<int64>(row->count[c]));
	for (double ms : row->work_ms)
	{
		nulls[col] = !row->has_times;
		values[col++] = row->has_times ? Float8GetDatum(ms) : (Datum) 0;
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

// idem_scope_stats_get(): the rows of idem_scope_stats for the current database, those the
// caller may see (sees_all_scopes: every scope; otherwise none). No rows without shared memory.
IDEM_SQL_FUNCTION(idem_scope_stats_get)
{
	InitMaterializedSRF(fcinfo, 0);
	ReturnSetInfo *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
	if (rsinfo->setDesc->natts != scope_stats_columns)
		elog(ERROR, "idempotency: idem_scope_stats_get() must return %d columns", scope_stats_columns);
	if (!scope_stats_enabled())
		preload_notice_if_missing();
	if (!scope_stats_enabled() || !sees_all_scopes())
		PG_RETURN_VOID();
	scope_stats_each(put_scope_row, rsinfo);
	PG_RETURN_VOID();
}

// idem_scope_stats_reset(): forget the current database's scopes.
IDEM_SQL_FUNCTION(idem_scope_stats_reset)
{
	scope_stats_forget_database();
	PG_RETURN_VOID();
}
