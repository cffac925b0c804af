#include "stats/dbstats.hpp"

#include "common/compat.hpp"
#include "common/dbslots.hpp"

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
db_stats_request_shmem()
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
	return db_slot_find(shared->lock, shared->slot, dboid, create);
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
	int backend = compat::my_backend_index();
	if (db == nullptr || backend < 0 || backend >= MaxBackends)
		return nullptr;
	BackendSlot *b = &shared->backend[backend];
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

bool
db_stats_add(Counter c, uint64 n)
{
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return false;
	add_own(b, c, n);
	return true;
}

bool
db_stats_add_all(const uint64 *counts)
{
	BackendSlot *b = my_backend_slot();
	if (b == nullptr)
		return false;
	for (int c = 0; c < static_cast<int>(Counter::count); c++)
		if (counts[c] != 0)
			add_own(b, static_cast<Counter>(c), counts[c]);
	return true;
}

void
db_stats_dealloc(Oid dboid, uint64 n)
{
	// Evictions happen in whichever backend needs room, for any database's entries: counted
	// with the exited backends' counts, which are shared and atomic.
	DbSlot *s = find_slot(dboid, true);
	if (s != nullptr)
		pg_atomic_fetch_add_u64(&s->exited.value[static_cast<int>(Counter::dealloc)], n);
}

void
db_stats_reaped(int64 n)
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

// This database's counters since the last reset (false without a slot).
bool
db_stats_counts(uint64 total[])
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

static bool
read_time(pg_atomic_uint64 DbSlot::*field, TimestampTz *t)
{
	DbSlot *s = my_database_slot();
	uint64 value = s == nullptr ? no_time : pg_atomic_read_u64(&(s->*field));
	*t = static_cast<TimestampTz>(value);
	return value != no_time;
}

bool
db_stats_last_reap_at(TimestampTz *t)
{
	return read_time(&DbSlot::last_reap_at, t);
}

bool
db_stats_reset_at(TimestampTz *t)
{
	return read_time(&DbSlot::stats_reset, t);
}

void
db_stats_reset()
{
	DbSlot *s = my_database_slot();
	if (s == nullptr)
		return;
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

} // namespace idem
