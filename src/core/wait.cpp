#include "core/wait.hpp"

#include "common/preload.hpp"

extern "C" {
#include "common/hashfn.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
}

namespace idem {

// Enough that sleepers on different keys rarely share one (a shared one costs them a look).
static constexpr int num_partitions = 1024;
static constexpr int bitmap_words = num_partitions / 64;

struct WaitShared
{
	ConditionVariable cv[num_partitions];
};

static WaitShared *shared = nullptr;
static shmem_request_hook_type prev_shmem_request_hook = nullptr;
static shmem_startup_hook_type prev_shmem_startup_hook = nullptr;

// The partitions this transaction changed a key of, to wake at its commit.
static uint64 to_wake[bitmap_words];
static bool any_to_wake = false;

static void
wait_shmem_request()
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(WaitShared)));
}

static void
wait_shmem_startup()
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	bool found;
	shared = static_cast<WaitShared *>(ShmemInitStruct("idempotency waiters", sizeof(WaitShared), &found));
	if (!found)
	{
		for (int i = 0; i < num_partitions; i++)
			ConditionVariableInit(&shared->cv[i]);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
wait_request_shmem()
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = wait_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = wait_shmem_startup;
}

static int
partition_of(Datum scope, Datum key)
{
	text *s = DatumGetTextPP(scope);
	text *k = DatumGetTextPP(key);
	uint32 h = hash_bytes_uint32(MyDatabaseId);
	h = hash_combine(h, hash_bytes((const unsigned char *) VARDATA_ANY(s), VARSIZE_ANY_EXHDR(s)));
	h = hash_combine(h, hash_bytes((const unsigned char *) VARDATA_ANY(k), VARSIZE_ANY_EXHDR(k)));
	return (int) (h % num_partitions);
}

void
wake_at_commit(Datum scope, Datum key)
{
	if (shared == nullptr)
		return;
	int p = partition_of(scope, key);
	to_wake[p / 64] |= UINT64CONST(1) << (p % 64);
	any_to_wake = true;
}

// At commit the change is already visible to others (the commit callbacks run after the
// transaction left the proc array). A rolled back transaction changed nothing: nobody to wake.
// After PREPARE TRANSACTION the commit happens elsewhere: sleepers then wake at the lease's end
// or their deadline, whichever comes first.
static void
wake_on_commit(XactEvent event, void *)
{
	if (!any_to_wake)
		return;
	if (event == XACT_EVENT_COMMIT)
	{
		for (int w = 0; w < bitmap_words; w++)
		{
			for (uint64 bits = to_wake[w]; bits != 0; bits &= bits - 1)
				ConditionVariableBroadcast(&shared->cv[w * 64 + pg_rightmost_one_pos64(bits)]);
		}
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE ||
	    event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
	{
		memset(to_wake, 0, sizeof(to_wake));
		any_to_wake = false;
	}
}

void
wait_register_callbacks()
{
	RegisterXactCallback(wake_on_commit, nullptr);
}

void
waiter_begin(Waiter *w, const Interval *wait, Datum scope, Datum key)
{
	w->bounded = wait != nullptr;
	w->deadline = w->bounded ? DatumGetTimestampTz(DirectFunctionCall2(
	                               timestamptz_pl_interval, TimestampTzGetDatum(GetCurrentTimestamp()),
	                               PointerGetDatum(wait)))
	                         : 0;
	w->cv = nullptr;
	w->scope = scope;
	w->key = key;
}

// Milliseconds until t, rounded up so that the next look is at or after t.
static long
ms_until(TimestampTz t, TimestampTz now)
{
	return (long) ((t - now + 999) / 1000);
}

bool
waiter_sleep(Waiter *w, TimestampTz lease_end)
{
	if (!w->bounded)
		return false;
	TimestampTz now = GetCurrentTimestamp();
	if (now >= w->deadline)
		return false;
	if (shared == nullptr)
	{
		// Nothing can wake us before a timeout: wait only for what the clock decides, a lease
		// that ends before the deadline (then the key is taken over or found finished).
		preload_notice_if_missing();
		if (lease_end > w->deadline)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
		                 Max(ms_until(lease_end, now), 1L), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		return true;
	}
	if (w->cv == nullptr)
	{
		w->cv = &shared->cv[partition_of(w->scope, w->key)];
		ConditionVariablePrepareToSleep(w->cv);
		return true;
	}
	(void) ConditionVariableTimedSleep(w->cv, Max(ms_until(Min(lease_end, w->deadline), now), 1L),
	                                   PG_WAIT_EXTENSION);
	return true;
}

void
waiter_end(Waiter *w)
{
	if (w->cv != nullptr)
		ConditionVariableCancelSleep();
	w->cv = nullptr;
}

} // namespace idem
