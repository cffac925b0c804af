#include "core/tablepath.hpp"

#include "access/expiry.hpp"
#include "access/writememo.hpp"
#include "stats/stats.hpp"

namespace idem {

// ON CONFLICT's rule at REPEATABLE READ and above: a committed version the transaction's
// snapshot cannot see is a serialization failure, not something to act on.
static void
check_serializable(KeyTable *kt)
{
	if (IsolationUsesXactSnapshot() && !keytable_found_visible_to(kt, GetTransactionSnapshot()))
		serialization_failure("update");
}

static void
serialization_failure_after(TM_Result result)
{
	if (IsolationUsesXactSnapshot())
		serialization_failure(result == TM_Deleted ? "delete" : "update");
}

// The key's latest version; with `wait`, other transactions' writes are waited for only until
// its deadline.
static Found
find_for_claim(KeyTable *kt, const ClaimInput *in, const Waiter *waiter)
{
	if (waiter->bounded)
		return keytable_find_latest_until(kt, in->scope, in->key, waiter->deadline);
	return keytable_find_latest(kt, in->scope, in->key) ? Found::row : Found::none;
}

// False when `wait` ran out on a concurrent writer of the row: nothing was written.
static bool
write_takeover(KeyTable *kt, const KeyRow *row, const Waiter *waiter, TM_Result *result)
{
	if (waiter->bounded)
		return keytable_update_until(kt, row, waiter->deadline, result);
	*result = keytable_update(kt, row);
	return true;
}

// Claims one key; `guess_new`: insert before looking (see last_claim_created). True when it
// inserted the key's row.
static bool
claim_direct(KeyTable *kt, const ClaimInput *in, Waiter *waiter, ClaimOutput *out, bool guess_new)
{
	const Catalog *c = &kt->catalog;
	bool insert_first = guess_new && !IsolationUsesXactSnapshot() &&
	                    !keytable_wrote_last(kt, in->scope, in->key);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row;
		Found found = insert_first ? Found::none : find_for_claim(kt, in, waiter);
		if (found == Found::busy)
		{
			answer_unseen(in->scope, out);
			return false;
		}
		if (found == Found::none)
		{
			insert_first = false;
			new_row(c, in, clock_now(), &row);
			if (!keytable_insert(kt, &row))
				continue; // the key exists, or a concurrent insert won: look, and wait for it
			CommandCounterIncrement();
			answer(c, Outcome::claimed, true, &row, out);
			return true;
		}

		bool own = TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt));
		if (!own)
			check_serializable(kt);
		keytable_read(kt, kt->found, &row);
		TimestampTz now = clock_now();
		Step step = decide(c, &row, in, own, now);
		if (step == Step::in_progress)
		{
			keytable_before_wait(kt);
			if (waiter_sleep(waiter, DatumGetTimestampTz(row.value[COL_LOCKED_UNTIL])))
			{
				keytable_release_found(kt);
				continue; // woken, or the lease ended: look again
			}
		}
		if (step != Step::takeover && step != Step::expired)
		{
			answer_read(c, step, &row, now, out);
			return false;
		}
		// An expired key is claimed anew in place: the same result as a delete and an insert,
		// with one write.
		if (step == Step::expired)
			new_row(c, in, now, &row);
		else
			takeover_row(c, in, now, &row);
		TM_Result result;
		if (!write_takeover(kt, &row, waiter, &result))
		{
			answer_unseen(in->scope, out);
			return false;
		}
		if (result != TM_Ok)
		{
			serialization_failure_after(result);
			continue; // changed since we read it: decide again on the new version
		}
		CommandCounterIncrement();
		if (step == Step::expired)
			stats_count(Counter::expired, in->scope);
		answer(c, Outcome::claimed, step == Step::expired, &row, out);
		return false;
	}
}

// Whether this backend's last claim created its key. Most claims are of new keys (a retry is the
// exception), and for a new key a look before the insert searches the primary key twice; so after
// a claim that created its key, the next one inserts first, as ON CONFLICT's race path does: the
// unique check decides, and on a conflict the speculative tuple is killed before the key is looked
// up. A wrong guess costs one killed tuple and a transaction id; after a claim that found its key
// the next one looks first again, so a run of replays stays read-only. Not for the key this
// transaction just wrote (a re-entrant claim writes nothing), and only at READ COMMITTED:
// REPEATABLE READ and SERIALIZABLE keep the look first. A batch refines the guess (BatchGuess).
static bool last_claim_created = false;

void
table_claim(KeyTable *kt, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	last_claim_created = claim_direct(kt, in, waiter, out, last_claim_created);
}

void
table_batch_guess_begin(BatchGuess *guess)
{
	guess->created = 0;
	guess->existing = 0;
	guess->insert_first = last_claim_created;
}

void
table_batch_claim(KeyTable *kt, BatchGuess *guess, const ClaimInput *in, Waiter *waiter,
                  ClaimOutput *out)
{
	guess->note(claim_direct(kt, in, waiter, out, guess->insert_first));
}

void
table_batch_guess_end(const BatchGuess *guess)
{
	last_claim_created = guess->insert_first;
}

// Changes the key's current row with change(row), which checks it and may raise (complete, fail,
// extend, release): as UPDATE ... WHERE key = ... would, waiting for a concurrent writer of the
// row and checking its new version. Returns the written row.
Datum
table_update(KeyTable *kt, Datum scope, Datum key, RowChange change, void *arg)
{
	for (bool first = true;; first = false)
	{
		CHECK_FOR_INTERRUPTS();
		// Usually the row this transaction just claimed: then no index probe is needed.
		bool found = (first && keytable_find_own_last(kt, scope, key)) ||
		             keytable_find_latest(kt, scope, key);
		if (!found)
		{
			// Absent, or moved by a concurrent update while the scan ran: a fresh look tells.
			if (keytable_exists_now(kt, scope, key))
				continue;
			key_not_found(key);
		}
		if (!TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt)))
			check_serializable(kt);
		KeyRow row;
		keytable_read(kt, kt->found, &row);
		change(arg, &row);
		TM_Result result = keytable_update(kt, &row);
		if (result == TM_Ok)
			break;
		serialization_failure_after(result);
	}
	CommandCounterIncrement();
	return keytable_written_datum(kt);
}

// Deletes the key's current row after check(row), which may raise; as DELETE ... WHERE key = ...
// would, waiting for a concurrent writer. False when there is no row.
bool
table_delete(KeyTable *kt, Datum scope, Datum key, RowCheck check, void *arg)
{
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (!keytable_find_latest(kt, scope, key))
		{
			if (keytable_exists_now(kt, scope, key))
				continue;
			return false;
		}
		if (!TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt)))
			check_serializable(kt);
		KeyRow row;
		keytable_read(kt, kt->found, &row);
		check(arg, &row);
		TM_Result result = keytable_delete(kt);
		if (result == TM_Ok)
			break;
		serialization_failure_after(result);
	}
	CommandCounterIncrement();
	return true;
}

int64
table_reap(KeyTable *kt, int32 max_rows)
{
	TimestampTz now = clock_now();
	// Autosummarization is off (its request queue overflows at high claim rates): reaping keeps
	// the summaries current, before the scan that relies on them.
	(void) keytable_summarize_new_ranges(kt);
	Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
	ExpiryScan scan;
	keytable_expiry_begin(kt, &scan, now, snapshot);
	int64 reaped = 0;
	while (reaped < max_rows && keytable_expiry_next(kt, &scan))
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row;
		keytable_read(kt, kt->found, &row);
		// Rows another transaction holds are skipped, never waited for.
		if (expired(&kt->catalog, &row, now) && keytable_delete_unless_busy(kt))
			reaped++;
	}
	keytable_expiry_end(&scan);
	UnregisterSnapshot(snapshot);
	if (reaped > 0)
		CommandCounterIncrement();
	return reaped;
}

bool
table_lookup(KeyTable *kt, Datum scope, Datum key, Datum *row)
{
	Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
	bool found = keytable_find_visible(kt, scope, key, snapshot);
	if (found)
	{
		KeyRow stored;
		keytable_read(kt, kt->found, &stored);
		found = !expired(&kt->catalog, &stored, clock_now());
	}
	if (found)
		*row = keytable_found_datum(kt);
	UnregisterSnapshot(snapshot);
	return found;
}

} // namespace idem
