#include "worker/reapers.hpp"

#include "common/dbslots.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem {

// One slot per database that a reaper has served since the server started; never given back.
// When all are in use, a further database's reaper runs without coordinating (reaper_claim).
static constexpr int max_databases = 256;
static constexpr const char *tranche_name = "idempotency reapers";

struct ReaperSlot
{
	Oid dboid;            // InvalidOid: free; written once, under the exclusive lock
	pg_atomic_uint32 pid; // the reaper serving this database, 0 if none
};

struct ReapersShared
{
	LWLock *lock; // guards slot assignment; claiming and reading a pid take no lock
	ReaperSlot slot[max_databases];
};

static ReapersShared *shared = nullptr;
static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

static void
reapers_shmem_request()
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(ReapersShared)));
	RequestNamedLWLockTranche(tranche_name, 1);
}

static void
reapers_shmem_startup()
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	bool found;
	shared = static_cast<ReapersShared *>(ShmemInitStruct("idempotency reapers", sizeof(ReapersShared), &found));
	if (!found)
	{
		shared->lock = &(GetNamedLWLockTranche(tranche_name))->lock;
		for (ReaperSlot &s : shared->slot)
		{
			s.dboid = InvalidOid;
			pg_atomic_init_u32(&s.pid, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

void
reapers_request_shmem()
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = reapers_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = reapers_shmem_startup;
}

static ReaperSlot *
find_slot(Oid dboid, bool create)
{
	if (shared == nullptr || !OidIsValid(dboid))
		return nullptr;
	return db_slot_find(shared->lock, shared->slot, dboid, create);
}

static void
release_reaper(int, Datum arg)
{
	ReaperSlot *s = reinterpret_cast<ReaperSlot *>(DatumGetPointer(arg));
	uint32 expected = static_cast<uint32>(MyProcPid);
	pg_atomic_compare_exchange_u32(&s->pid, &expected, 0);
}

bool
reaper_claim(Oid dboid)
{
	ReaperSlot *s = find_slot(dboid, true);
	if (s == nullptr)
		return true; // no shared memory to coordinate through: run anyway
	uint32 expected = 0;
	if (!pg_atomic_compare_exchange_u32(&s->pid, &expected, static_cast<uint32>(MyProcPid)))
		return expected == static_cast<uint32>(MyProcPid);
	before_shmem_exit(release_reaper, PointerGetDatum(s));
	return true;
}

int
reaper_pid(Oid dboid)
{
	ReaperSlot *s = find_slot(dboid, false);
	return s == nullptr ? 0 : static_cast<int>(pg_atomic_read_u32(&s->pid));
}

} // namespace idem
