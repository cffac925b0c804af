#include "access/lockwait.hpp"

#include "common/compat.hpp"

namespace idem {

// Milliseconds from now to the deadline, rounded up; at least 1, since 0 disables lock_timeout.
static int
lock_timeout_ms(TimestampTz deadline)
{
	int64 usecs = deadline - GetCurrentTimestamp();
	int64 ms = (usecs + 999) / 1000;
	return (int) Max(Min(ms, (int64) INT_MAX), (int64) 1);
}

bool
run_with_lock_deadline(TimestampTz deadline, void (*fn)(void *), void *arg)
{
	int timeout = lock_timeout_ms(deadline);
	MemoryContext caller = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	BeginInternalSubTransaction(nullptr);
	// Results fn allocates belong to the caller, not to the subtransaction.
	MemoryContextSwitchTo(caller);
	bool completed = true;
	PG_TRY();
	{
		char value[16];
		snprintf(value, sizeof(value), "%d", timeout);
		// Set inside the subtransaction: its end, commit or abort, restores the caller's value.
		(void) set_config_option("lock_timeout", value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
		                         true, 0, false);
		fn(arg);
		// A lock_timeout that fired just as the wait ended leaves its cancel pending: ProcSleep
		// keeps the timeout's indicator, and the next interrupt check raises 55P03. Take it here,
		// where it is caught, not at the caller's next check. A real cancel still propagates.
		CHECK_FOR_INTERRUPTS();
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller);
		ErrorData *error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(caller);
		CurrentResourceOwner = owner;
		// Only our lock_timeout raises this here: it replaced the session's.
		if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(error);
		FreeErrorData(error);
		completed = false;
	}
	PG_END_TRY();
	return completed;
}

bool
xact_wait_until(TransactionId xid, Relation rel, ItemPointer tid, TimestampTz deadline)
{
	if (deadline <= GetCurrentTimestamp())
		return compat::transaction_ended_without_waiting(xid);
	auto wait = [&] { XactLockTableWait(xid, rel, tid, XLTW_InsertIndex); };
	return with_lock_deadline(deadline, wait);
}

} // namespace idem
