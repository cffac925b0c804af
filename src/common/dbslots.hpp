// A fixed array of per-database slots in shared memory, looked up by database OID under one
// LWLock: stats/dbstats (the counters) and worker/reapers (which reaper serves a database) each
// keep one. Slot needs an `Oid dboid` member, InvalidOid when free.
#pragma once

#include "common/pg.hpp"

extern "C" {
#include "storage/lwlock.h"
}

namespace idem {

// The slot of `dboid`, taking a free one when `create` (nullptr when none is free); a shared
// look first, so that the common case never takes the lock exclusively.
template <typename Slot, int N>
Slot *
db_slot_find(LWLock *lock, Slot (&slots)[N], Oid dboid, bool create)
{
	LWLockAcquire(lock, LW_SHARED);
	for (Slot &s : slots)
		if (s.dboid == dboid)
		{
			LWLockRelease(lock);
			return &s;
		}
	LWLockRelease(lock);
	if (!create)
		return nullptr;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	Slot *result = nullptr;
	for (Slot &s : slots)
		if (s.dboid == dboid)
			result = &s;
	for (int i = 0; i < N && result == nullptr; i++)
		if (slots[i].dboid == InvalidOid)
		{
			result = &slots[i];
			result->dboid = dboid;
		}
	LWLockRelease(lock);
	return result;
}

} // namespace idem
