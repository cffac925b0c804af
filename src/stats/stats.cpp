#include "stats/stats.hpp"

#include "common/guard.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem {

// One slot per database that has counted something since the server started. Slots are never
// given back (a dropped database keeps its slot until the next restart); when all are in use,
// further databases are not counted and their idem_stats row shows NULL counters.
static constexpr int max_databases = 256;
static constexpr int num_counters = static_cast<int>(Counter::count);
static constexpr const char *tranche_name = "idempotency";
static constexpr uint64 no_time = PG_UINT64_MAX; // "never" in the timestamp fields

struct DbSlot
{
	Oid dboid;                    // InvalidOid: free; written once, under the exclusive lock
	pg_atomic_uint32 reaper_pid;  // the reaper serving this database, 0 if none
	pg_atomic_uint64 counter[num_counters];
	pg_atomic_uint64 last_reap_at; // TimestampTz, or no_time
	pg_atomic_uint64 stats_reset;  // TimestampTz, or no_time
};

struct StatsShared
{
	LWLock *lock; // guards slot assignment (dboid) only; counters are atomics
	DbSlot slot[max_databases];
};

static StatsShared *shared = nullptr;
static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

// This backend's slot: a backend is connected to one database for its whole life.
static DbSlot *my_slot = nullptr;
static bool my_slot_unavailable = false;

static void
stats_shmem_request()
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(StatsShared)));
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
		shared->lock = &(GetNamedLWLockTranche(tranche_name))->lock;
		for (int i = 0; i < max_databases; i++)
		{
			DbSlot *s = &shared->slot[i];
			s->dboid = InvalidOid;
			pg_atomic_init_u32(&s->reaper_pid, 0);
			for (int c = 0; c < num_counters; c++)
				pg_atomic_init_u64(&s->counter[c], 0);
			pg_atomic_init_u64(&s->last_reap_at, no_time);
			pg_atomic_init_u64(&s->stats_reset, no_time);
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

void
stats_count(Counter c, uint64 n)
{
	if (n == 0)
		return;
	DbSlot *s = my_database_slot();
	if (s != nullptr)
		pg_atomic_fetch_add_u64(&s->counter[static_cast<int>(c)], n);
}

void
stats_reaped(int64 n)
{
	DbSlot *s = my_database_slot();
	if (s == nullptr)
		return;
	pg_atomic_fetch_add_u64(&s->counter[static_cast<int>(Counter::reaped)], static_cast<uint64>(n));
	pg_atomic_fetch_add_u64(&s->counter[static_cast<int>(Counter::reaper_runs)], 1);
	pg_atomic_write_u64(&s->last_reap_at, static_cast<uint64>(GetCurrentTimestamp()));
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

// idem_stats_get(): the row of the idem_stats view for the current database.
IDEM_SQL_FUNCTION(idem_stats_get)
{
	TupleDesc desc;
	if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
		                errmsg("function returning record called in context that cannot accept type record")));
	desc = BlessTupleDesc(desc);
	if (desc->natts != num_counters + 2)
		elog(ERROR, "idempotency: idem_stats_get() must return %d columns", num_counters + 2);

	Datum values[num_counters + 2];
	bool nulls[num_counters + 2];
	DbSlot *s = my_database_slot();
	for (int c = 0; c < num_counters; c++)
	{
		nulls[c] = (s == nullptr);
		values[c] = s == nullptr ? (Datum) 0
		                         : Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&s->counter[c])));
	}
	uint64 times[2] = {s == nullptr ? no_time : pg_atomic_read_u64(&s->last_reap_at),
	                   s == nullptr ? no_time : pg_atomic_read_u64(&s->stats_reset)};
	for (int i = 0; i < 2; i++)
	{
		nulls[num_counters + i] = (times[i] == no_time);
		values[num_counters + i] =
		    times[i] == no_time ? (Datum) 0 : TimestampTzGetDatum(static_cast<TimestampTz>(times[i]));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

// idem_stats_reset(): zero this database's counters (nothing to do without shared memory).
IDEM_SQL_FUNCTION(idem_stats_reset)
{
	DbSlot *s = my_database_slot();
	if (s != nullptr)
	{
		for (int c = 0; c < num_counters; c++)
			pg_atomic_write_u64(&s->counter[c], 0);
		pg_atomic_write_u64(&s->last_reap_at, no_time);
		pg_atomic_write_u64(&s->stats_reset, static_cast<uint64>(GetCurrentTimestamp()));
	}
	PG_RETURN_VOID();
}
