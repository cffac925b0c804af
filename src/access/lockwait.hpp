// Lock waits with a deadline. PostgreSQL's lock manager waits either without bound or not at all
// (the Conditional* calls); its only timed wait is lock_timeout, which ends the wait with an ERROR.
// So a bounded wait runs under lock_timeout inside an internal subtransaction, as a PL/pgSQL
// exception block does, and a timeout is caught there and rolled back.
#pragma once

#include "common/pg.hpp"

namespace idem {

// Runs fn(arg), whose lock waits end at `deadline`: true when it ran to the end, false when a lock
// wait ran out (whatever fn did is rolled back). Any other error, cancel and statement_timeout
// included, propagates. The lock manager counts in whole milliseconds, so a deadline already passed
// still allows a wait of 1 ms. The deadline replaces the session's lock_timeout inside fn: the
// caller's explicit bound is the more specific one.
bool run_with_lock_deadline(TimestampTz deadline, void (*fn)(void *), void *arg);

template <typename Fn>
inline bool
with_lock_deadline(TimestampTz deadline, Fn &fn)
{
	return run_with_lock_deadline(deadline, [](void *f) { (*static_cast<Fn *>(f))(); }, &fn);
}

// Waits for transaction xid to end, as XactLockTableWait does, until `deadline`; false if it is
// still running then. A deadline already passed never blocks (ConditionalXactLockTableWait).
bool xact_wait_until(TransactionId xid, Relation rel, ItemPointer tid, TimestampTz deadline);

} // namespace idem
