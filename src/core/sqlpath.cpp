#include "core/sqlpath.hpp"

#include "access/expiry.hpp"
#include "access/lockwait.hpp"
#include "access/policypath.hpp"
#include "stats/stats.hpp"

namespace idem {

// A key whose insert conflicted but which the policies do not let this caller see.
static void
hidden_key(Datum key)
{
	ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
	                errmsg("idempotency key \"%s\" exists but row-level security hides it from this role",
	                       key_text(key))));
}

// A policy-path write that may wait for a concurrent writer of the key: with `wait`, only until
// its deadline (false then, nothing written).
template <typename Write>
static bool
write_with_policies(const Waiter *waiter, Write &write)
{
	if (waiter->bounded)
		return with_lock_deadline(waiter->deadline, write);
	write();
	return true;
}

void
sql_claim(const Catalog *c, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	PolicySql ps;
	policy_begin(&ps, c);
	for (int hidden_tries = 0;;)
	{
		CHECK_FOR_INTERRUPTS();
		// Another transaction's write of the key is waited for here, where the wait can be bounded.
		if (waiter->bounded && policy_probe_until(c, in->scope, in->key, waiter->deadline) == Found::busy)
		{
			answer_unseen(in->scope, out);
			break;
		}
		KeyRow row, stored;
		new_row(c, in, clock_now(), &row);
		bool inserted = false;
		auto insert = [&] { inserted = policy_insert(&ps, &row, &stored, nullptr); };
		if (!write_with_policies(waiter, insert))
		{
			answer_unseen(in->scope, out);
			break;
		}
		if (inserted)
		{
			answer(c, Outcome::claimed, true, &stored, out);
			break;
		}
		TransactionId xmin;
		if (!policy_fetch(&ps, in->scope, in->key, false, &stored, &xmin, nullptr))
		{
			// Reaped since the insert saw it, or hidden by a policy: a few tries tell them apart.
			if (++hidden_tries > 3)
				hidden_key(in->key);
			continue;
		}
		TimestampTz now = clock_now();
		Step step = decide(c, &stored, in, TransactionIdIsCurrentTransactionId(xmin), now);
		if (step == Step::in_progress &&
		    waiter_sleep(waiter, DatumGetTimestampTz(stored.value[COL_LOCKED_UNTIL])))
			continue; // woken, or the lease ended: look again
		if (step != Step::takeover && step != Step::expired)
		{
			answer_read(c, step, &stored, now, out);
			break;
		}
		if (step == Step::expired)
			new_row(c, in, now, &row);
		else
		{
			row = stored;
			takeover_row(c, in, now, &row);
		}
		KeyRow updated;
		bool written = false;
		auto update = [&] { written = policy_update(&ps, &stored, &row, &updated, nullptr); };
		if (!write_with_policies(waiter, update))
		{
			answer_unseen(in->scope, out);
			break;
		}
		if (written)
		{
			if (step == Step::expired)
				stats_count(Counter::expired, in->scope);
			answer(c, Outcome::claimed, step == Step::expired, &updated, out);
			break;
		}
	}
	policy_end(&ps);
}

Datum
sql_update(const Catalog *c, Datum scope, Datum key, RowChange change, void *arg)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	if (!policy_fetch(&ps, scope, key, true, &stored, nullptr, nullptr))
		key_not_found(key);
	KeyRow row = stored;
	change(arg, &row);
	KeyRow updated;
	Datum whole;
	// The row is locked: the update cannot miss it.
	if (!policy_update(&ps, &stored, &row, &updated, &whole))
		elog(ERROR, "idempotency: locked key \"%s\" changed", key_text(key));
	policy_end(&ps);
	return whole;
}

bool
sql_delete(const Catalog *c, Datum scope, Datum key, RowCheck check, void *arg)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	bool deleted = false;
	if (policy_fetch(&ps, scope, key, true, &stored, nullptr, nullptr))
	{
		check(arg, &stored);
		// The row is locked: the delete cannot miss it.
		if (!policy_delete(&ps, &stored))
			elog(ERROR, "idempotency: locked key \"%s\" changed", key_text(key));
		deleted = true;
	}
	policy_end(&ps);
	return deleted;
}

bool
sql_lookup(const Catalog *c, Datum scope, Datum key, Datum *row)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	bool found = policy_fetch(&ps, scope, key, false, &stored, nullptr, row) &&
	             !expired(c, &stored, clock_now());
	policy_end(&ps);
	return found;
}

int64
sql_reap(const Catalog *c, int32 max_rows)
{
	// As table_reap: the policies decide which keys this caller deletes, not which ranges get
	// summaries; without them a scan of the index reads the new ranges whole.
	(void) keytable_summarize_new_ranges_unopened(c);
	PolicySql ps;
	policy_begin(&ps, c);
	int64 reaped = policy_reap(&ps, clock_now(), max_rows);
	policy_end(&ps);
	return reaped;
}

} // namespace idem
