#include "stats/stats.hpp"

#include "common/guard.hpp"
#include "common/settings.hpp"
#include "stats/scopestats.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem {

// Counting costs a backend no shared cache line: each backend adds to its own slot, which only it
// writes (plain loads and stores, no locked instructions), and idem_stats sums the slots of the
// database when it is read. A backend's counts move into its database's slot when it exits, so
// they outlive it. The same shape serves any statistics keyed by something a backend writes often.
//
// One database slot per database that has counted something since the server started. Slots are
// never given back (a dropped database keeps its slot until the next restart); when all are in
// use, further databases are not counted and their idem_stats row shows NULL counters.
static constexpr int max_databases = 256;
static constexpr int num_counters = static_cast<int>(Counter::count);
static constexpr const char *tranche_name = "idempotency";
static constexpr uint64 no_time = PG_UINT64_MAX; // "never" in the timestamp fields

struct Counters
{
	pg_atomic_uint64 value[num_counters];
};

struct DbSlot
{
	Oid dboid;                    // InvalidOid: free; written once, under the exclusive lock
	pg_atomic_uint32 reaper_pid;  // the reaper serving this database, 0 if none
	Counters exited;              // counts of the backends that have exited
	Counters at_reset;            // the database's totals at the last reset
	pg_atomic_uint64 last_reap_at; // TimestampTz, or no_time
	pg_atomic_uint64 stats_reset;  // TimestampTz, or no_time
};

// A backend's own counters, on cache lines of their own so that neighbours do not share them.
struct alignas(PG_CACHE_LINE_SIZE) BackendSlot
{
	DbSlot *db; // the database counted for; nullptr when the slot is free
	Counters counts;
};

struct StatsShared
{
	// Guards database slot assignment, which backend slot counts for which database, and the
	// move of an exiting backend's counts (exclusive); readers summing take it shared. Counting
	// itself takes no lock.
	LWLock *lock;
	DbSlot slot[max_databases];
	BackendSlot *backend; // indexed by BackendId - 1, MaxBackends of them
};

static StatsShared *shared = nullptr;
static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

// This backend's slots: a backend is connected to one database for its whole life.
static DbSlot *my_slot = nullptr;
static BackendSlot *my_backend = nullptr;
static bool my_slot_unavailable = false;

// With room to start the backend slots on a cache line.
static Size
backend_slots_size()
{
	return add_size(mul_size(sizeof(BackendSlot), MaxBackends), PG_CACHE_LINE_SIZE);
}

static void
counters_init(Counters *c)
{
	for (int i = 0; i < num_counters; i++)
		pg_atomic_init_u64(&c->value[i], 0);
}

static void
stats_shmem_request()
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(StatsShared)), backend_slots_size()));
	RequestNamedLWLockTranche(tranche_name, 1);
}

static void
stats_shmem_startup()
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	bool found;
	shared = static_cast<StatsShared *>(ShmemInitStruct("idempotency stats", sizeof(StatsShared), &found));
	if (!found)
	{
		bool backends_found;
		void *backends = ShmemInitStruct("idempotency backend counters", backend_slots_size(), &backends_found);
		shared->backend = reinterpret_cast<BackendSlot *>(CACHELINEALIGN(backends));
		shared->lock = &(GetNamedLWLockTranche(tranche_name))->lock;
		for (int i = 0; i < max_databases; i++)
		{
			DbSlot *s = &shared->slot[i];
			s->dboid = InvalidOid;
			pg_atomic_init_u32(&s->reaper_pid, 0);
			counters_init(&s->exited);
			counters_init(&s->at_reset);
			pg_atomic_init_u64(&s->last_reap_at, no_time);
			pg_atomic_init_u64(&s->stats_reset, no_time);
		}
		for (int i = 0; i < MaxBackends; i++)
		{
			shared->backend[i].db = nullptr;
			counters_init(&shared->backend[i].counts);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

void
stats_request_shmem()
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}

static DbSlot *
find_slot(Oid dboid, bool create)
{
	if (shared == nullptr || !OidIsValid(dboid))
		return nullptr;
	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < max_databases; i++)
		if (shared->slot[i].dboid == dboid)
		{
			LWLockRelease(shared->lock);
			return &shared->slot[i];
		}
	LWLockRelease(shared->lock);
	if (!create)
		return nullptr;

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	DbSlot *result = nullptr;
	for (int i = 0; i < max_databases && result == nullptr; i++)
		if (shared->slot[i].dboid == dboid)
			result = &shared->slot[i];
	for (int i = 0; i < max_databases && result == nullptr; i++)
		if (shared->slot[i].dboid == InvalidOid)
		{
			result = &shared->slot[i];
			result->dboid = dboid;
		}
	LWLockRelease(shared->lock);
	return result;
}

// At exit: add this backend's counts to its database's and free its slot, in one step for
// readers (they sum under the shared lock).
static void
release_backend_slot(int, Datum)
{
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int c = 0; c < num_counters; c++)
	{
		pg_atomic_fetch_add_u64(&my_slot->exited.value[c], pg_atomic_read_u64(&my_backend->counts.value[c]));
		pg_atomic_write_u64(&my_backend->counts.value[c], 0);
	}
	my_backend->db = nullptr;
	LWLockRelease(shared->lock);
	my_backend = nullptr;
}

static DbSlot *
my_database_slot()
{
	if (my_slot == nullptr && !my_slot_unavailable && shared != nullptr && OidIsValid(MyDatabaseId))
	{
		my_slot = find_slot(MyDatabaseId, true);
		my_slot_unavailable = (my_slot == nullptr);
	}
	return my_slot;
}

// This backend's counters, taken on its first count (nullptr when it counts nowhere).
static BackendSlot *
my_backend_slot()
{
	if (my_backend != nullptr)
		return my_backend;
	DbSlot *db = my_database_slot();
	if (db == nullptr || MyBackendId == InvalidBackendId || MyBackendId > MaxBackends)
		return nullptr;
	BackendSlot *b = &shared->backend[MyBackendId - 1];
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	b->db = db;
	LWLockRelease(shared->lock);
	my_backend = b;
	before_shmem_exit(release_backend_slot, (Datum) 0);
	return b;
}

// Only this backend writes its slot: a read and a write, no locked read-modify-write.
static void
add_own(BackendSlot *b, Counter c, uint64 n)
{
	pg_atomic_uint64 *v = &b->counts.value[static_cast<int>(c)];
	pg_atomic_write_u64(v, pg_atomic_read_u64(v) + n);
}

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
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return;
	for (int c = 0; c < static_cast<int>(Counter::count); c++)
		if (batch.count[c] != 0)
			add_own(b, static_cast<Counter>(c), batch.count[c]);
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
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return;
	add_own(b, c, 1);
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
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return;
	add_own(b, c, 1);
	if (!setting_track)
		return;
	if (claimed_at == 0)
		scope_stats_count(c, scope);
	else
		scope_stats_finished(c, scope, Max(INT64CONST(0), GetCurrentTimestamp() - claimed_at));
}

void
stats_dealloc(Oid dboid, uint64 n)
{
	// Evictions happen in whichever backend needs room, for any database's entries: counted
	// with the exited backends' counts, which are shared and atomic.
	DbSlot *s = find_slot(dboid, true);
	if (s != nullptr)
		pg_atomic_fetch_add_u64(&s->exited.value[static_cast<int>(Counter::dealloc)], n);
}

void
stats_reaped(int64 n)
{
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return;
	add_own(b, Counter::reaped, static_cast<uint64>(n));
	add_own(b, Counter::reaper_runs, 1);
	pg_atomic_write_u64(&my_slot->last_reap_at, static_cast<uint64>(GetCurrentTimestamp()));
}

// The database's counts since the server started: the exited backends' plus the live ones'.
// The caller holds the lock.
static void
sum_counters(const DbSlot *db, uint64 total[num_counters])
{
	for (int c = 0; c < num_counters; c++)
		total[c] = pg_atomic_read_u64(const_cast<pg_atomic_uint64 *>(&db->exited.value[c]));
	for (int i = 0; i < MaxBackends; i++)
	{
		BackendSlot *b = &shared->backend[i];
		if (b->db != db)
			continue;
		for (int c = 0; c < num_counters; c++)
			total[c] += pg_atomic_read_u64(&b->counts.value[c]);
	}
}

static void
release_reaper(int, Datum arg)
{
	DbSlot *s = reinterpret_cast<DbSlot *>(DatumGetPointer(arg));
	uint32 expected = static_cast<uint32>(MyProcPid);
	pg_atomic_compare_exchange_u32(&s->reaper_pid, &expected, 0);
}

bool
stats_claim_reaper(Oid dboid)
{
	DbSlot *s = find_slot(dboid, true);
	if (s == nullptr)
		return true; // no shared memory to coordinate through: run anyway
	uint32 expected = 0;
	if (!pg_atomic_compare_exchange_u32(&s->reaper_pid, &expected, static_cast<uint32>(MyProcPid)))
		return expected == static_cast<uint32>(MyProcPid);
	before_shmem_exit(release_reaper, PointerGetDatum(s));
	return true;
}

int
stats_reaper_pid(Oid dboid)
{
	DbSlot *s = find_slot(dboid, false);
	return s == nullptr ? 0 : static_cast<int>(pg_atomic_read_u32(&s->reaper_pid));
}

} // namespace idem

using namespace idem;

// The counters of idem_stats, in its column order; then last_reap_at and stats_reset.
static constexpr Counter idem_stats_counters[] = {
	Counter::claims,    Counter::inserted, Counter::replays, Counter::in_progress,
	Counter::takeovers, Counter::mismatches, Counter::completes, Counter::fails,
	Counter::reaped,    Counter::reaper_runs};
static constexpr int idem_stats_columns = lengthof(idem_stats_counters) + 2;

// This database's counters since the last reset (false without a slot).
static bool
database_counts(uint64 total[num_counters])
{
	DbSlot *s = my_database_slot();
	if (s == nullptr)
		return false;
	LWLockAcquire(shared->lock, LW_SHARED);
	sum_counters(s, total);
	for (int c = 0; c < num_counters; c++)
		total[c] -= pg_atomic_read_u64(&s->at_reset.value[c]);
	LWLockRelease(shared->lock);
	return true;
}

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
	bool counted = database_counts(total);
	DbSlot *s = my_database_slot();
	int col = 0;
	for (Counter c : idem_stats_counters)
	{
		nulls[col] = !counted;
		values[col++] = counted ? Int64GetDatum(static_cast<int64>(total[static_cast<int>(c)])) : (Datum) 0;
	}
	uint64 times[2] = {s == nullptr ? no_time : pg_atomic_read_u64(&s->last_reap_at),
	                   s == nullptr ? no_time : pg_atomic_read_u64(&s->stats_reset)};
	for (uint64 t : times)
	{
		nulls[col] = (t == no_time);
		values[col++] = t == no_time ? (Datum) 0 : TimestampTzGetDatum(static_cast<TimestampTz>(t));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

// idem_stats_dealloc(): idem_stats' dealloc column (1.3), NULL without shared memory.
IDEM_SQL_FUNCTION(idem_stats_dealloc)
{
	uint64 total[num_counters];
	if (!database_counts(total))
		PG_RETURN_NULL();
	PG_RETURN_INT64(static_cast<int64>(total[static_cast<int>(Counter::dealloc)]));
}

// idem_stats_reset(): zero this database's counters (nothing to do without shared memory).
IDEM_SQL_FUNCTION(idem_stats_reset)
{
	DbSlot *s = my_database_slot();
	if (s != nullptr)
	{
		// The counters only grow; a reset records where they stand and idem_stats subtracts it.
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		uint64 total[num_counters];
		sum_counters(s, total);
		for (int c = 0; c < num_counters; c++)
			pg_atomic_write_u64(&s->at_reset.value[c], total[c]);
		pg_atomic_write_u64(&s->last_reap_at, no_time);
		pg_atomic_write_u64(&s->stats_reset, static_cast<uint64>(GetCurrentTimestamp()));
		LWLockRelease(shared->lock);
	}
	PG_RETURN_VOID();
}
