#include "stats/stats.hpp"

#include "common/settings.hpp"
#include "stats/dbstats.hpp"
#include "stats/scopestats.hpp"

namespace idem {

// The counts of the running batch (stats_batch_begin), not yet published.
static struct
{
	bool active;
	uint64 generation;
	Datum scope;
	uint64 count[static_cast<int>(Counter::count)];
} batch;

static void
publish_batch()
{
	if (!batch.active)
		return;
	batch.active = false;
	if (!db_stats_add_all(batch.count))
		return;
	if (!setting_track)
		return;
	// Per scope, a claim is counted with its answer (scope_stats_add), as by stats_count.
	batch.count[static_cast<int>(Counter::claims)] = 0;
	scope_stats_add(batch.scope, batch.count);
}

// The batch's memory context goes: still active means an error ended the batch.
static void
batch_context_gone(void *arg)
{
	if (batch.active && batch.generation == reinterpret_cast<uintptr_t>(arg))
		publish_batch();
}

void
stats_batch_begin(Datum scope)
{
	// A batch inside a batch (a row-level security policy calling idem_claim_batch): the outer
	// one's counts so far are published, its later ones counted one by one.
	publish_batch();
	batch.active = true;
	batch.generation++;
	batch.scope = PointerGetDatum(DatumGetTextPCopy(scope));
	memset(batch.count, 0, sizeof(batch.count));
	MemoryContextCallback *cb = (MemoryContextCallback *) palloc(sizeof(MemoryContextCallback));
	cb->func = batch_context_gone;
	cb->arg = reinterpret_cast<void *>(static_cast<uintptr_t>(batch.generation));
	MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);
}

void
stats_batch_end()
{
	publish_batch();
}

void
stats_count(Counter c, Datum scope)
{
	if (batch.active)
	{
		batch.count[static_cast<int>(c)]++;
		return;
	}
	if (!db_stats_add(c, 1))
		return;
	// Per scope, a claim is counted with its answer, in the same lookup (scope_stats_count).
	if (setting_track && c != Counter::claims)
		scope_stats_count(c, scope);
}

void
stats_finished(Counter c, Datum scope, TimestampTz claimed_at)
{
	if (batch.active && claimed_at == 0)
	{
		batch.count[static_cast<int>(c)]++;
		return;
	}
	if (!db_stats_add(c, 1))
		return;
	if (!setting_track)
		return;
	if (claimed_at == 0)
		scope_stats_count(c, scope);
	else
		scope_stats_finished(c, scope, Max(INT64CONST(0), GetCurrentTimestamp() - claimed_at));
}

void
stats_reaped(int64 n)
{
	db_stats_reaped(n);
}

} // namespace idem
