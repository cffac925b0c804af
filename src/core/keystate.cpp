#include "core/keystate.hpp"

#include "core/path.hpp"
#include "stats/stats.hpp"

namespace idem {

void
claim(const ClaimInput *given, ClaimOutput *out)
{
	stats_count(Counter::claims, given->scope);
	out->retry_after = nullptr;
	out->retry_after_s = 0;
	ClaimInput in = *given;
	Waiter waiter;
	waiter_begin(&waiter, in.wait, in.scope, in.key);
	KeyPath path;
	fingerprint_request(path_open(&path, Access::write, "idem_claim()"), &in);
	path_claim(&path, &in, &waiter, out);
	path_close(&path);
	waiter_end(&waiter);
}

Datum
finish(const FinishInput *in)
{
	const char *caller = in->to == STATE_SUCCEEDED ? "idem_complete()" : "idem_fail()";
	KeyPath path;
	const Catalog *c = path_open(&path, Access::write, caller);
	TimestampTz claimed_at = 0;
	auto change = [&](KeyRow *row) {
		claimed_at = attempt_claimed_at(row);
		finish_row(c, in, row);
	};
	Datum finished = path_update(&path, in->scope, in->key, change);
	path_close(&path);
	stats_finished(in->to == STATE_SUCCEEDED ? Counter::completes : Counter::fails, in->scope, claimed_at);
	wake_at_commit(in->scope, in->key);
	return finished;
}

Datum
set_lease(const LeaseInput *in)
{
	const char *caller = in->lease != nullptr ? "idem_extend()" : "idem_release()";
	KeyPath path;
	const Catalog *c = path_open(&path, Access::update, caller);
	TimestampTz claimed_at = 0;
	auto change = [&](KeyRow *row) {
		claimed_at = attempt_claimed_at(row);
		lease_row(c, in, row);
	};
	Datum written = path_update(&path, in->scope, in->key, change);
	path_close(&path);
	// A released key is free now, and its attempt over; an extended one only keeps its waiters
	// waiting longer.
	if (in->lease == nullptr)
	{
		stats_finished(Counter::releases, in->scope, claimed_at);
		wake_at_commit(in->scope, in->key);
	}
	return written;
}

bool
forget(Datum scope, Datum key, bool force)
{
	KeyPath path;
	const Catalog *c = path_open(&path, Access::forget, "idem_forget()");
	auto check = [&](const KeyRow *row) { check_forgettable(c, key, force, row); };
	bool deleted = path_delete(&path, scope, key, check);
	path_close(&path);
	if (deleted)
		wake_at_commit(scope, key);
	return deleted;
}

bool
lookup(Datum scope, Datum key, Datum *row)
{
	KeyPath path;
	path_open(&path, Access::read, "idem_lookup()");
	bool found = path_lookup(&path, scope, key, row);
	path_close(&path);
	return found;
}

int64
reap(int32 max_rows)
{
	KeyPath path;
	path_open(&path, Access::reap, "idem_reap()");
	int64 reaped = path_reap(&path, max_rows);
	path_close(&path);
	stats_reaped(reaped);
	return reaped;
}

} // namespace idem
