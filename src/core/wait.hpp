// Waiting for an in-flight duplicate in lease mode (docs/contract.md §9.3): a claim that finds a
// committed pending key with a live lease sleeps on a condition variable until the key's owner
// commits a change to it (finish, release, forget), the lease ends, or the claim's `wait` runs out.
//
// The condition variables are a fixed array in shared memory, a key hashed to one of them with
// its database and scope; several keys share one, so a wake-up means "look again", never "it
// changed". A transaction that changed a key wakes that key's sleepers from its commit callback,
// after the commit is visible, so a sleeper that looks again finds the new row.
#pragma once

#include "common/pg.hpp"

extern "C" {
#include "storage/condition_variable.h"
}

namespace idem {

// shared_preload_libraries only: ask for the condition variables.
void wait_request_shmem();
// At load: the commit callback that wakes sleepers.
void wait_register_callbacks();

// Wake the sleepers on this key when the current transaction commits.
void wake_at_commit(Datum scope, Datum key);

struct Waiter
{
	bool bounded;               // `wait` was given
	TimestampTz deadline;       // the call's start + wait
	ConditionVariable *cv;      // the key's, once prepared to sleep on it
	Datum scope;
	Datum key;
};

// wait: nullptr (no waiting, as in 1.1) or the claim's `wait`.
void waiter_begin(Waiter *w, const Interval *wait, Datum scope, Datum key);

// Called on a live lease ending at lease_end: true when the caller should look at the key again
// (after a wake-up, the lease's end, or right after the first call, which prepares the sleep so
// that a commit between that look and the sleep is not missed), false when the waiting is over.
// Holds no lock, pin or snapshot of its own; cancel and statement_timeout interrupt it.
bool waiter_sleep(Waiter *w, TimestampTz lease_end);

void waiter_end(Waiter *w);

} // namespace idem
