#include "core/keystate.hpp"

#include "access/lockwait.hpp"
#include "access/policypath.hpp"
#include "common/errors.hpp"
#include "common/settings.hpp"
#include "core/wait.hpp"
#include "stats/stats.hpp"

namespace idem {

// ---------------------------------------------------------------------------------------------
// The rules, shared by the table access path and the SQL path (row-level security)

// Leases and expiry are wall-clock time, not the transaction's start.
static TimestampTz
clock_now()
{
	return GetCurrentTimestamp();
}

static TimestampTz
add_interval(TimestampTz t, const Interval *interval)
{
	return DatumGetTimestampTz(
	    DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(t), PointerGetDatum(interval)));
}

static void
invalid_duration(const char *name)
{
	ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
	                errmsg("argument \"%s\" must be a positive interval of at most 100 years", name)));
}

TimestampTz
duration_end(TimestampTz from, const Interval *interval, const char *name)
{
	static const Interval zero = {0, 0, 0};
	static const Interval hundred_years = {0, 0, 100 * MONTHS_PER_YEAR};
	// The comparison first keeps the addition below from overflowing.
	if (!DatumGetBool(DirectFunctionCall2(interval_gt, PointerGetDatum(interval), PointerGetDatum(&zero))) ||
	    !DatumGetBool(DirectFunctionCall2(interval_le, PointerGetDatum(interval), PointerGetDatum(&hundred_years))))
		invalid_duration(name);
	TimestampTz end = add_interval(from, interval);
	if (end <= from || end > add_interval(from, &hundred_years))
		invalid_duration(name);
	return end;
}

static TimestampTz
lease_end(const ClaimInput *in, TimestampTz now)
{
	if (in->lease == nullptr)
		return now + setting_default_lease_ms * INT64CONST(1000);
	return duration_end(now, in->lease, "lease");
}

static TimestampTz
expiry(const ClaimInput *in, TimestampTz now)
{
	if (in->ttl == nullptr)
		return now + setting_default_ttl_s * USECS_PER_SEC;
	return duration_end(now, in->ttl, "ttl");
}

static const char *
key_text(Datum key)
{
	return text_to_cstring(DatumGetTextPP(key));
}

static bool
fingerprints_distinct(const KeyRow *row, const ClaimInput *in)
{
	bool stored = !row->isnull[COL_FINGERPRINT];
	if (stored != in->has_fingerprint)
		return true;
	if (!stored)
		return false;
	bytea *a = DatumGetByteaPP(row->value[COL_FINGERPRINT]);
	bytea *b = DatumGetByteaPP(in->fingerprint);
	return VARSIZE_ANY_EXHDR(a) != VARSIZE_ANY_EXHDR(b) ||
	       memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) != 0;
}

static bool
row_in_state(const Catalog *c, const KeyRow *row, KeyState state)
{
	return DatumGetObjectId(row->value[COL_STATE]) == c->state_label[state];
}

static void
set_state(const Catalog *c, KeyRow *row, KeyState state)
{
	row->value[COL_STATE] = ObjectIdGetDatum(c->state_label[state]);
	row->isnull[COL_STATE] = false;
}

static void
set_timestamp(KeyRow *row, Column c, TimestampTz t)
{
	row->value[c] = TimestampTzGetDatum(t);
	row->isnull[c] = false;
}

static void
set_null(KeyRow *row, Column c)
{
	row->value[c] = (Datum) 0;
	row->isnull[c] = true;
}

static void
serialization_failure(const char *what)
{
	ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
	                errmsg("could not serialize access due to concurrent %s", what)));
}

static void
new_row(const Catalog *c, const ClaimInput *in, TimestampTz now, KeyRow *row)
{
	for (int col = 0; col < NUM_COLUMNS; col++)
		set_null(row, (Column) col);
	row->value[COL_SCOPE] = in->scope;
	row->isnull[COL_SCOPE] = false;
	row->value[COL_KEY] = in->key;
	row->isnull[COL_KEY] = false;
	set_state(c, row, STATE_PENDING);
	row->value[COL_ATTEMPT] = Int32GetDatum(1);
	row->isnull[COL_ATTEMPT] = false;
	if (in->has_fingerprint)
	{
		row->value[COL_FINGERPRINT] = in->fingerprint;
		row->isnull[COL_FINGERPRINT] = false;
	}
	set_timestamp(row, COL_CREATED_AT, now);
	set_timestamp(row, COL_LOCKED_UNTIL, lease_end(in, now));
	set_timestamp(row, COL_EXPIRES_AT, expiry(in, now));
}

// A new lease on an abandoned or retryable key: the fencing token moves on, the old outcome goes.
static void
takeover_row(const Catalog *c, const ClaimInput *in, TimestampTz now, KeyRow *row)
{
	int32 attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	if (attempt == PG_INT32_MAX)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
		                errmsg("idempotency key \"%s\" has been taken over too many times", key_text(in->key))));
	row->value[COL_ATTEMPT] = Int32GetDatum(attempt + 1);
	set_state(c, row, STATE_PENDING);
	set_null(row, COL_RESPONSE);
	set_null(row, COL_RESPONSE_CODE);
	set_null(row, COL_RETRYABLE);
	set_null(row, COL_COMPLETED_AT);
	set_timestamp(row, COL_LOCKED_UNTIL, lease_end(in, now));
	TimestampTz expires = expiry(in, now);
	if (expires > DatumGetTimestampTz(row->value[COL_EXPIRES_AT]))
		set_timestamp(row, COL_EXPIRES_AT, expires);
}

enum class Step
{
	owned,       // this transaction wrote the row
	replay,      // finished for good
	in_progress, // someone else's live lease
	takeover,    // abandoned lease or retryable failure
};

// SPEC §2 steps 3 to 7 for an existing row; raises IK001 on a fingerprint mismatch.
static Step
decide(const Catalog *c, const KeyRow *row, const ClaimInput *in, bool own, TimestampTz now)
{
	bool mismatch = fingerprints_distinct(row, in);
	stats_count(Counter::mismatches, mismatch);
	if (mismatch)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_MISMATCH),
		                errmsg("idempotency key \"%s\" was already used with a different request",
		                       key_text(in->key)),
		                errhint("Use a new idempotency key for a different request.")));
	// The owner is the owner, whatever the clock says.
	if (own)
		return Step::owned;
	bool retryable = !row->isnull[COL_RETRYABLE] && DatumGetBool(row->value[COL_RETRYABLE]);
	if (row_in_state(c, row, STATE_SUCCEEDED) || (row_in_state(c, row, STATE_FAILED) && !retryable))
		return Step::replay;
	if (row_in_state(c, row, STATE_PENDING) && !row->isnull[COL_LOCKED_UNTIL] &&
	    DatumGetTimestampTz(row->value[COL_LOCKED_UNTIL]) > now)
		return Step::in_progress;
	return Step::takeover;
}

// The result's columns of the row. The response is the only one by reference, and must outlive
// the buffer or SPI memory the row was read from.
static void
set_result_row(const Catalog *c, const KeyRow *row, ClaimOutput *out)
{
	out->attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	out->state = row->value[COL_STATE];
	out->response_null = row->isnull[COL_RESPONSE];
	out->response = out->response_null ? (Datum) 0
	                                   : datumCopy(row->value[COL_RESPONSE], c->typbyval[COL_RESPONSE],
	                                               c->typlen[COL_RESPONSE]);
	out->response_code_null = row->isnull[COL_RESPONSE_CODE];
	out->response_code = out->response_code_null ? 0 : DatumGetInt32(row->value[COL_RESPONSE_CODE]);
	out->expires_at = DatumGetTimestampTz(row->value[COL_EXPIRES_AT]);
}

static void
answer(const Catalog *c, Outcome outcome, bool inserted, const KeyRow *row, ClaimOutput *out)
{
	out->outcome = outcome;
	out->inserted = inserted;
	out->unseen = false;
	set_result_row(c, row, out);
	switch (outcome)
	{
		case Outcome::claimed:
			stats_count(inserted ? Counter::inserted : Counter::takeovers);
			break;
		case Outcome::replay:
			stats_count(Counter::replays);
			break;
		case Outcome::in_progress:
			stats_count(Counter::in_progress);
			break;
		case Outcome::count:
			break;
	}
}

// The outcome of a step that writes nothing.
static void
answer_read(const Catalog *c, Step step, const KeyRow *row, TimestampTz now, ClaimOutput *out)
{
	if (step == Step::in_progress)
	{
		out->retry_after = DatumGetIntervalP(
		    DirectFunctionCall2(timestamp_mi, row->value[COL_LOCKED_UNTIL], TimestampTzGetDatum(now)));
		answer(c, Outcome::in_progress, false, row, out);
	}
	else if (step == Step::owned && row_in_state(c, row, STATE_PENDING))
	{
		// A re-entrant claim of a pending key: still this transaction's claim, neither new nor taken over.
		out->outcome = Outcome::claimed;
		out->inserted = false;
		out->unseen = false;
		set_result_row(c, row, out);
	}
	else
		answer(c, Outcome::replay, false, row, out);
}

// `wait` ran out while another transaction still held the key uncommitted.
static void
answer_unseen(ClaimOutput *out)
{
	out->outcome = Outcome::in_progress;
	out->inserted = false;
	out->unseen = true;
	out->attempt = 0;
	out->state = (Datum) 0;
	out->response_null = true;
	out->response = (Datum) 0;
	out->response_code_null = true;
	out->response_code = 0;
	out->expires_at = 0;
	stats_count(Counter::in_progress);
}

static const char *
state_name(const Catalog *c, const KeyRow *row)
{
	return row_in_state(c, row, STATE_SUCCEEDED) ? "succeeded"
	       : row_in_state(c, row, STATE_FAILED)  ? "failed"
	                                             : "pending";
}

// complete/fail on the key's current row: fencing first, then the state (IK002 before IK004).
static void
finish_row(const Catalog *c, const FinishInput *in, KeyRow *row)
{
	int32 attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	if (in->has_attempt && in->attempt != attempt)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_ATTEMPT_STALE),
		                errmsg("attempt %d of idempotency key \"%s\" is stale", in->attempt,
		                       key_text(in->key)),
		                attempt > 1
		                    ? errdetail("The key was taken over; its current attempt is %d.", attempt)
		                    : errdetail("The key has not been taken over; its current attempt is %d.", attempt)));
	if (!row_in_state(c, row, STATE_PENDING))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_PENDING),
		                errmsg("idempotency key \"%s\" is not pending", key_text(in->key)),
		                errdetail("The key is already finished; its state is %s.", state_name(c, row))));

	set_state(c, row, in->to);
	row->value[COL_RESPONSE] = in->response;
	row->isnull[COL_RESPONSE] = in->response_null;
	row->value[COL_RESPONSE_CODE] = Int32GetDatum(in->response_code);
	row->isnull[COL_RESPONSE_CODE] = false;
	if (in->to == STATE_FAILED)
	{
		row->value[COL_RETRYABLE] = BoolGetDatum(in->retryable);
		row->isnull[COL_RETRYABLE] = false;
	}
	else
		set_null(row, COL_RETRYABLE);
	set_timestamp(row, COL_COMPLETED_AT, clock_now());
	set_null(row, COL_LOCKED_UNTIL);
}

static void
key_not_found(Datum key)
{
	ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
	                errmsg("idempotency key \"%s\" does not exist", key_text(key))));
}

static bool
expired_and_free(const Catalog *c, const KeyRow *row, TimestampTz now)
{
	// A live lease means someone is working on the key right now.
	return !(row_in_state(c, row, STATE_PENDING) && !row->isnull[COL_LOCKED_UNTIL] &&
	         DatumGetTimestampTz(row->value[COL_LOCKED_UNTIL]) > now);
}

// ---------------------------------------------------------------------------------------------
// The table access path

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

// Whether this backend's last claim created its key. Most claims are of new keys (a retry is the
// exception), and for a new key a look before the insert searches the primary key twice; so after
// a claim that created its key, the next one inserts first, as ON CONFLICT's race path does: the
// unique check decides, and on a conflict the speculative tuple is killed before the key is looked
// up. A wrong guess costs one killed tuple and a transaction id; after a claim that found its key
// the next one looks first again, so a run of replays stays read-only. Not for the key this
// transaction just wrote (a re-entrant claim writes nothing), and only at READ COMMITTED:
// REPEATABLE READ and SERIALIZABLE keep the look first.
static bool last_claim_created = false;

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

static void
claim_direct(KeyTable *kt, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	const Catalog *c = &kt->catalog;
	bool insert_first = last_claim_created && !IsolationUsesXactSnapshot() &&
	                    !keytable_wrote_last(kt, in->scope, in->key);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row;
		Found found = insert_first ? Found::none : find_for_claim(kt, in, waiter);
		if (found == Found::busy)
		{
			answer_unseen(out);
			return;
		}
		if (found == Found::none)
		{
			insert_first = false;
			new_row(c, in, clock_now(), &row);
			if (!keytable_insert(kt, &row))
				continue; // the key exists, or a concurrent insert won: look, and wait for it
			last_claim_created = true;
			CommandCounterIncrement();
			answer(c, Outcome::claimed, true, &row, out);
			return;
		}
		last_claim_created = false;

		bool own = TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt));
		if (!own)
			check_serializable(kt);
		keytable_read(kt, kt->found, &row);
		TimestampTz now = clock_now();
		Step step = decide(c, &row, in, own, now);
		if (step == Step::in_progress &&
		    waiter_sleep(waiter, DatumGetTimestampTz(row.value[COL_LOCKED_UNTIL])))
		{
			keytable_release_found(kt);
			continue; // woken, or the lease ended: look again
		}
		if (step != Step::takeover)
		{
			answer_read(c, step, &row, now, out);
			return;
		}
		takeover_row(c, in, now, &row);
		TM_Result result;
		if (!write_takeover(kt, &row, waiter, &result))
		{
			answer_unseen(out);
			return;
		}
		if (result != TM_Ok)
		{
			serialization_failure_after(result);
			continue; // changed since we read it: decide again on the new version
		}
		CommandCounterIncrement();
		answer(c, Outcome::claimed, false, &row, out);
		return;
	}
}

static Datum
finish_direct(KeyTable *kt, const FinishInput *in)
{
	for (bool first = true;; first = false)
	{
		CHECK_FOR_INTERRUPTS();
		// Usually the row this transaction just claimed: then no index probe is needed.
		bool found = (first && keytable_find_own_last(kt, in->scope, in->key)) ||
		             keytable_find_latest(kt, in->scope, in->key);
		if (!found)
		{
			// Absent, or moved by a concurrent update while the scan ran: a fresh look tells.
			if (keytable_exists_now(kt, in->scope, in->key))
				continue;
			key_not_found(in->key);
		}
		if (!TransactionIdIsCurrentTransactionId(keytable_found_xmin(kt)))
			check_serializable(kt);
		KeyRow row;
		keytable_read(kt, kt->found, &row);
		finish_row(&kt->catalog, in, &row);
		TM_Result result = keytable_update(kt, &row);
		if (result == TM_Ok)
			break;
		serialization_failure_after(result);
	}
	CommandCounterIncrement();
	return keytable_written_datum(kt);
}

static int64
reap_direct(KeyTable *kt, int32 max_rows)
{
	TimestampTz now = clock_now();
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
		if (expired_and_free(&kt->catalog, &row, now) && keytable_delete_unless_busy(kt))
			reaped++;
	}
	keytable_expiry_end(&scan);
	UnregisterSnapshot(snapshot);
	if (reaped > 0)
		CommandCounterIncrement();
	return reaped;
}

// ---------------------------------------------------------------------------------------------
// The SQL path, when row-level security applies to the caller

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

static void
claim_with_policies(const Catalog *c, const ClaimInput *in, Waiter *waiter, ClaimOutput *out)
{
	PolicySql ps;
	policy_begin(&ps, c);
	for (int hidden_tries = 0;;)
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row, stored;
		new_row(c, in, clock_now(), &row);
		bool inserted = false;
		auto insert = [&] { inserted = policy_insert(&ps, &row, &stored, nullptr); };
		if (!write_with_policies(waiter, insert))
		{
			answer_unseen(out);
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
		if (step != Step::takeover)
		{
			answer_read(c, step, &stored, now, out);
			break;
		}
		row = stored;
		takeover_row(c, in, now, &row);
		KeyRow updated;
		bool written = false;
		auto update = [&] { written = policy_update(&ps, &stored, &row, &updated, nullptr); };
		if (!write_with_policies(waiter, update))
		{
			answer_unseen(out);
			break;
		}
		if (written)
		{
			answer(c, Outcome::claimed, false, &updated, out);
			break;
		}
	}
	policy_end(&ps);
}

static Datum
finish_with_policies(const Catalog *c, const FinishInput *in)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	if (!policy_fetch(&ps, in->scope, in->key, true, &stored, nullptr, nullptr))
		key_not_found(in->key);
	KeyRow row = stored;
	finish_row(c, in, &row);
	KeyRow updated;
	Datum whole;
	// The row is locked: the update cannot miss it.
	if (!policy_update(&ps, &stored, &row, &updated, &whole))
		elog(ERROR, "idempotency: locked key \"%s\" changed", key_text(in->key));
	policy_end(&ps);
	return whole;
}

// ---------------------------------------------------------------------------------------------
// Entry points

void
claim(const ClaimInput *in, ClaimOutput *out)
{
	stats_count(Counter::claims);
	out->retry_after = nullptr;
	Waiter waiter;
	waiter_begin(&waiter, in->wait, in->scope, in->key);
	KeyTable kt;
	if (keytable_open(&kt, Access::write, "idem_claim()"))
	{
		claim_direct(&kt, in, &waiter, out);
		keytable_close(&kt);
	}
	else
		claim_with_policies(&kt.catalog, in, &waiter, out);
	waiter_end(&waiter);
}

Datum
finish(const FinishInput *in)
{
	const char *caller = in->to == STATE_SUCCEEDED ? "idem_complete()" : "idem_fail()";
	KeyTable kt;
	Datum finished;
	if (keytable_open(&kt, Access::write, caller))
	{
		finished = finish_direct(&kt, in);
		keytable_close(&kt);
	}
	else
		finished = finish_with_policies(&kt.catalog, in);
	stats_count(in->to == STATE_SUCCEEDED ? Counter::completes : Counter::fails);
	wake_at_commit(in->scope, in->key);
	return finished;
}

bool
lookup(Datum scope, Datum key, Datum *row)
{
	KeyTable kt;
	if (!keytable_open(&kt, Access::read, "idem_lookup()"))
	{
		PolicySql ps;
		policy_begin(&ps, &kt.catalog);
		KeyRow stored;
		bool found = policy_fetch(&ps, scope, key, false, &stored, nullptr, row);
		policy_end(&ps);
		return found;
	}
	Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
	bool found = keytable_find_visible(&kt, scope, key, snapshot);
	if (found)
		*row = keytable_found_datum(&kt);
	UnregisterSnapshot(snapshot);
	keytable_close(&kt);
	return found;
}

int64
reap(int32 max_rows)
{
	KeyTable kt;
	int64 reaped;
	if (keytable_open(&kt, Access::reap, "idem_reap()"))
	{
		reaped = reap_direct(&kt, max_rows);
		keytable_close(&kt);
	}
	else
	{
		PolicySql ps;
		policy_begin(&ps, &kt.catalog);
		reaped = policy_reap(&ps, clock_now(), max_rows);
		policy_end(&ps);
	}
	stats_reaped(reaped);
	return reaped;
}

} // namespace idem
