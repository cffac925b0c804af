#include "core/keystate.hpp"

#include "access/lockwait.hpp"
#include "access/policypath.hpp"
#include "common/errors.hpp"
#include "common/fingerprint.hpp"
#include "common/settings.hpp"
#include "core/wait.hpp"
#include "stats/scopestats.hpp"
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
	// Leases and ttls are mostly plain times ('30 seconds'): a valid one needs no calendar, since
	// interval_le compares 100 years as 36,000 days (30-day months), less than any 100 calendar
	// years ahead. The general path below gives the same end, at many times the cost per claim;
	// it also answers every invalid interval.
	TimestampTz end;
	if (interval->month == 0 && interval->day == 0 && interval->time > 0 &&
	    interval->time <= 100 * MONTHS_PER_YEAR * DAYS_PER_MONTH * USECS_PER_DAY &&
	    !pg_add_s64_overflow(from, interval->time, &end) && IS_VALID_TIMESTAMP(end))
		return end;
	// The comparison first keeps the addition below from overflowing.
	if (!DatumGetBool(DirectFunctionCall2(interval_gt, PointerGetDatum(interval), PointerGetDatum(&zero))) ||
	    !DatumGetBool(DirectFunctionCall2(interval_le, PointerGetDatum(interval), PointerGetDatum(&hundred_years))))
		invalid_duration(name);
	end = add_interval(from, interval);
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
bytea_equal(Datum a, Datum b)
{
	bytea *x = DatumGetByteaPP(a);
	bytea *y = DatumGetByteaPP(b);
	return VARSIZE_ANY_EXHDR(x) == VARSIZE_ANY_EXHDR(y) &&
	       memcmp(VARDATA_ANY(x), VARDATA_ANY(y), VARSIZE_ANY_EXHDR(x)) == 0;
}

static bool
fingerprints_distinct(const Catalog *c, const KeyRow *row, const ClaimInput *in)
{
	bool stored = !row->isnull[COL_FINGERPRINT];
	if (stored != in->has_fingerprint)
		return true;
	if (!stored || bytea_equal(row->value[COL_FINGERPRINT], in->fingerprint))
		return false;
	// A key stored by 1.1 holds 1.1's fingerprint, which differs from 1.2's only for a request with
	// trailing fraction zeros in a number. It can only equal the one computed here for the same
	// request (SHA-256), so accepting it raises no false IK001 and lets no different request in.
	// Computed only on this path: a match needs no second hash.
	if (in->request == nullptr || !c->version_1_2)
		return true;
	Datum old = PointerGetDatum(request_fingerprint_1_1(DatumGetTextPP(in->scope), in->request));
	return !bytea_equal(row->value[COL_FINGERPRINT], old);
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

// ClaimInput::applied: the claim's row is written already completed, as idem_complete with no
// response would leave it, so that the key takes one row version instead of two.
static void
applied_row(const Catalog *c, TimestampTz now, KeyRow *row)
{
	set_state(c, row, STATE_SUCCEEDED);
	set_null(row, COL_LOCKED_UNTIL);
	set_timestamp(row, COL_COMPLETED_AT, now);
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
	set_timestamp(row, COL_CLAIMED_AT, now);
	set_timestamp(row, COL_LOCKED_UNTIL, lease_end(in, now));
	set_timestamp(row, COL_EXPIRES_AT, expiry(in, now));
	if (in->applied)
		applied_row(c, now, row);
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
	set_null(row, COL_RESPONSE_BODY);
	set_null(row, COL_RESPONSE_HEADERS);
	set_null(row, COL_RETRYABLE);
	set_null(row, COL_COMPLETED_AT);
	set_timestamp(row, COL_CLAIMED_AT, now);
	set_timestamp(row, COL_LOCKED_UNTIL, lease_end(in, now));
	TimestampTz expires = expiry(in, now);
	if (expires > DatumGetTimestampTz(row->value[COL_EXPIRES_AT]))
		set_timestamp(row, COL_EXPIRES_AT, expires);
	if (in->applied)
		applied_row(c, now, row);
}

static bool
live_lease(const Catalog *c, const KeyRow *row, TimestampTz now)
{
	return row_in_state(c, row, STATE_PENDING) && !row->isnull[COL_LOCKED_UNTIL] &&
	       DatumGetTimestampTz(row->value[COL_LOCKED_UNTIL]) > now;
}

// SPEC §9.1: past expires_at and nobody working on it. Every function treats such a key as
// absent, whether or not the reaper has deleted it yet.
static bool
expired(const Catalog *c, const KeyRow *row, TimestampTz now)
{
	return DatumGetTimestampTz(row->value[COL_EXPIRES_AT]) <= now && !live_lease(c, row, now);
}

enum class Step
{
	owned,       // this transaction wrote the row
	expired,     // as if absent: claimed anew in place
	replay,      // finished for good
	in_progress, // someone else's live lease
	takeover,    // abandoned lease or retryable failure
};

// SPEC §2 steps 3 to 7 for an existing row; raises IK001 on a fingerprint mismatch.
static Step
decide(const Catalog *c, const KeyRow *row, const ClaimInput *in, bool own, TimestampTz now)
{
	// An expired key is a new key: a different request is no mismatch. This transaction's own row
	// is still its own, whatever the clock says (a re-entrant claim answers what it wrote).
	if (!own && expired(c, row, now))
		return Step::expired;
	if (fingerprints_distinct(c, row, in))
	{
		stats_count(Counter::mismatches, in->scope);
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_MISMATCH),
		                errmsg("idempotency key \"%s\" was already used with a different request",
		                       key_text(in->key)),
		                errhint("Use a new idempotency key for a different request.")));
	}
	// The owner is the owner, whatever the clock says.
	if (own)
		return Step::owned;
	bool retryable = !row->isnull[COL_RETRYABLE] && DatumGetBool(row->value[COL_RETRYABLE]);
	if (row_in_state(c, row, STATE_SUCCEEDED) || (row_in_state(c, row, STATE_FAILED) && !retryable))
		return Step::replay;
	if (live_lease(c, row, now))
		return Step::in_progress;
	return Step::takeover;
}

// A by-reference column's value, copied: it must outlive the buffer or SPI memory the row was read
// from.
static Datum
copy_column(const Catalog *c, const KeyRow *row, Column col)
{
	return row->isnull[col] ? (Datum) 0 : datumCopy(row->value[col], c->typbyval[col], c->typlen[col]);
}

// The result's columns of the row.
static void
set_result_row(const Catalog *c, const KeyRow *row, ClaimOutput *out)
{
	out->attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	out->state = row->value[COL_STATE];
	out->response_null = row->isnull[COL_RESPONSE];
	out->response = copy_column(c, row, COL_RESPONSE);
	out->response_body_null = row->isnull[COL_RESPONSE_BODY];
	out->response_body = copy_column(c, row, COL_RESPONSE_BODY);
	out->response_headers_null = row->isnull[COL_RESPONSE_HEADERS];
	out->response_headers = copy_column(c, row, COL_RESPONSE_HEADERS);
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
	Datum scope = row->value[COL_SCOPE];
	switch (outcome)
	{
		case Outcome::claimed:
			stats_count(inserted ? Counter::inserted : Counter::takeovers, scope);
			// Claimed already applied (ClaimInput::applied): the attempt is also complete, with no
			// work time to record.
			if (row_in_state(c, row, STATE_SUCCEEDED))
				stats_finished(Counter::completes, scope, 0);
			break;
		case Outcome::replay:
			stats_count(Counter::replays, scope);
			break;
		case Outcome::in_progress:
			stats_count(Counter::in_progress, scope);
			break;
		case Outcome::count:
			break;
	}
}

// SPEC §9.5: whole seconds after which a retry of an in_progress key is useful, at least 1 and at
// most the lease left, rounded up. The one place for that estimate. Once the scope's statistics
// know how long its attempts take (scope_stats_work_times), the attempt is expected to end at its
// claimed_at + the scope's p90; past that, at claimed_at + p99; past both, nothing better than
// the lease's end is known. Until then (or with idempotency.track off, or without preload): the
// lease left.
static int32
retry_after_seconds(const KeyRow *row, TimestampTz now)
{
	TimestampTz locked_until = DatumGetTimestampTz(row->value[COL_LOCKED_UNTIL]);
	int64 left = locked_until - now; // > 0: the lease is live
	int64 wait = left;
	int64 p90, p99;
	if (!row->isnull[COL_CLAIMED_AT] && scope_stats_work_times(row->value[COL_SCOPE], &p90, &p99))
	{
		TimestampTz claimed_at = DatumGetTimestampTz(row->value[COL_CLAIMED_AT]);
		TimestampTz end = claimed_at + p90 > now ? claimed_at + p90
		                  : claimed_at + p99 > now ? claimed_at + p99
		                                           : locked_until;
		wait = Min(end - now, left);
	}
	int64 left_s = (left + USECS_PER_SEC - 1) / USECS_PER_SEC;
	int64 seconds = (wait + USECS_PER_SEC - 1) / USECS_PER_SEC;
	return (int32) Max(INT64CONST(1), Min(Min(seconds, left_s), (int64) PG_INT32_MAX));
}

// The outcome of a step that writes nothing.
static void
answer_read(const Catalog *c, Step step, const KeyRow *row, TimestampTz now, ClaimOutput *out)
{
	if (step == Step::in_progress)
	{
		out->retry_after = DatumGetIntervalP(
		    DirectFunctionCall2(timestamp_mi, row->value[COL_LOCKED_UNTIL], TimestampTzGetDatum(now)));
		out->retry_after_s = retry_after_seconds(row, now);
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

// `wait` ran out while another transaction still held the key uncommitted: nothing committed to
// show. A retry is useful as soon as that transaction ends, which no lease bounds: the least
// retry_after_s (SPEC §9.5).
static void
answer_unseen(Datum scope, ClaimOutput *out)
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
	out->retry_after = nullptr;
	out->retry_after_s = 1;
	out->response_body_null = true;
	out->response_body = (Datum) 0;
	out->response_headers_null = true;
	out->response_headers = (Datum) 0;
	stats_count(Counter::in_progress, scope);
}

static const char *
state_name(const Catalog *c, const KeyRow *row)
{
	return row_in_state(c, row, STATE_SUCCEEDED) ? "succeeded"
	       : row_in_state(c, row, STATE_FAILED)  ? "failed"
	                                             : "pending";
}

static void
key_not_found(Datum key)
{
	ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
	                errmsg("idempotency key \"%s\" does not exist", key_text(key))));
}

// What the owner's calls (complete, fail, extend, release) check on the key's current row: it
// exists (not expired), fencing, then the state (IK003, then IK002 before IK004).
static void
check_owner(const Catalog *c, Datum key, bool has_attempt, int32 given, const KeyRow *row,
            TimestampTz now)
{
	if (expired(c, row, now))
		key_not_found(key);
	int32 attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	if (has_attempt && given != attempt)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_ATTEMPT_STALE),
		                errmsg("attempt %d of idempotency key \"%s\" is stale", given, key_text(key)),
		                attempt > 1
		                    ? errdetail("The key was taken over; its current attempt is %d.", attempt)
		                    : errdetail("The key has not been taken over; its current attempt is %d.", attempt)));
	if (!row_in_state(c, row, STATE_PENDING))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_PENDING),
		                errmsg("idempotency key \"%s\" is not pending", key_text(key)),
		                errdetail("The key is already finished; its state is %s.", state_name(c, row))));
}

static void
set_value(KeyRow *row, Column c, bool isnull, Datum value)
{
	row->value[c] = isnull ? (Datum) 0 : value;
	row->isnull[c] = isnull;
}

// complete/fail on the key's current row.
static void
finish_row(const Catalog *c, const FinishInput *in, KeyRow *row)
{
	TimestampTz now = clock_now();
	check_owner(c, in->key, in->has_attempt, in->attempt, row, now);

	set_state(c, row, in->to);
	set_value(row, COL_RESPONSE, in->response_null, in->response);
	row->value[COL_RESPONSE_CODE] = Int32GetDatum(in->response_code);
	row->isnull[COL_RESPONSE_CODE] = false;
	set_value(row, COL_RESPONSE_BODY, in->body_null, in->body);
	set_value(row, COL_RESPONSE_HEADERS, in->headers_null, in->headers);
	if (in->to == STATE_FAILED)
	{
		row->value[COL_RETRYABLE] = BoolGetDatum(in->retryable);
		row->isnull[COL_RETRYABLE] = false;
	}
	else
		set_null(row, COL_RETRYABLE);
	set_timestamp(row, COL_COMPLETED_AT, now);
	set_null(row, COL_LOCKED_UNTIL);
	// SPEC §9.2: the result's own lifetime, counted from its completion.
	if (in->ttl != nullptr)
		set_timestamp(row, COL_EXPIRES_AT, duration_end(now, in->ttl, "ttl"));
}

// extend/release on the key's current row.
static void
lease_row(const Catalog *c, const LeaseInput *in, KeyRow *row)
{
	TimestampTz now = clock_now();
	check_owner(c, in->key, true, in->attempt, row, now);
	set_timestamp(row, COL_LOCKED_UNTIL, in->lease != nullptr ? duration_end(now, in->lease, "lease") : now);
}

// idem_forget refuses a key someone is working on right now, unless forced.
static void
check_forgettable(const Catalog *c, Datum key, bool force, const KeyRow *row)
{
	if (!force && live_lease(c, row, clock_now()))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_IN_PROGRESS),
		                errmsg("idempotency key \"%s\" is in progress", key_text(key)),
		                errdetail("Its lease of attempt %d has not ended.",
		                          DatumGetInt32(row->value[COL_ATTEMPT])),
		                errhint("Wait for the lease to end, or pass force => true.")));
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
// REPEATABLE READ and SERIALIZABLE keep the look first. A batch refines the guess (BatchGuess).
static bool last_claim_created = false;

// A batch's guess, key by key, whether the next key is new. A wrong insert-first (the key exists)
// costs a killed heap tuple, a primary-key entry and a BRIN look-up before the look-up, about
// twice what a wrong look-first (the key is new) costs; so inserting first pays while more than
// two thirds of the keys are new. The batch inserts first while the key before was new and at
// least two thirds of its keys so far were: a run of new keys (a fresh poll) inserts without a
// look-up, a run of applied ones (a redelivery) looks without writing after its first, and ids
// half new and half applied in no order (random ids of a partly redelivered poll) look first
// instead of paying a killed insertion for every applied id that follows a new one. Its first key
// follows the backend's last claim.
struct BatchGuess
{
	int created = 0;
	int existing = 0;
	bool insert_first = last_claim_created;

	void note(bool key_created)
	{
		(key_created ? created : existing)++;
		insert_first = key_created && created >= 2 * existing;
	}
};

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

// Changes the key's current row with change(row), which checks it and may raise (complete, fail,
// extend, release): as UPDATE ... WHERE key = ... would, waiting for a concurrent writer of the
// row and checking its new version. Returns the written row.
template <typename Change>
static Datum
update_direct(KeyTable *kt, Datum scope, Datum key, Change change)
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
		change(&row);
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
template <typename Check>
static bool
delete_direct(KeyTable *kt, Datum scope, Datum key, Check check)
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
		check(&row);
		TM_Result result = keytable_delete(kt);
		if (result == TM_Ok)
			break;
		serialization_failure_after(result);
	}
	CommandCounterIncrement();
	return true;
}

static int64
reap_direct(KeyTable *kt, int32 max_rows)
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
		// Another transaction's write of the key is waited for here, where the wait can be bounded.
		if (waiter->bounded && keytable_probe_until(c, in->scope, in->key, waiter->deadline) == Found::busy)
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

template <typename Change>
static Datum
update_with_policies(const Catalog *c, Datum scope, Datum key, Change change)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	if (!policy_fetch(&ps, scope, key, true, &stored, nullptr, nullptr))
		key_not_found(key);
	KeyRow row = stored;
	change(&row);
	KeyRow updated;
	Datum whole;
	// The row is locked: the update cannot miss it.
	if (!policy_update(&ps, &stored, &row, &updated, &whole))
		elog(ERROR, "idempotency: locked key \"%s\" changed", key_text(key));
	policy_end(&ps);
	return whole;
}

template <typename Check>
static bool
delete_with_policies(const Catalog *c, Datum scope, Datum key, Check check)
{
	PolicySql ps;
	policy_begin(&ps, c);
	KeyRow stored;
	bool deleted = false;
	if (policy_fetch(&ps, scope, key, true, &stored, nullptr, nullptr))
	{
		check(&stored);
		// The row is locked: the delete cannot miss it.
		if (!policy_delete(&ps, &stored))
			elog(ERROR, "idempotency: locked key \"%s\" changed", key_text(key));
		deleted = true;
	}
	policy_end(&ps);
	return deleted;
}

// ---------------------------------------------------------------------------------------------
// Entry points

// The request's fingerprint in the form the installed version stores: 1.1's until ALTER EXTENSION
// UPDATE has run, so that the library behaves as the version its SQL objects belong to.
static void
fingerprint_request(const Catalog *c, ClaimInput *in)
{
	if (in->has_fingerprint || in->request == nullptr)
		return;
	text *scope = DatumGetTextPP(in->scope);
	bytea *fingerprint = c->version_1_2 ? request_fingerprint(scope, in->request)
	                                    : request_fingerprint_1_1(scope, in->request);
	in->has_fingerprint = true;
	in->fingerprint = PointerGetDatum(fingerprint);
}

void
claim(const ClaimInput *given, ClaimOutput *out)
{
	stats_count(Counter::claims, given->scope);
	out->retry_after = nullptr;
	out->retry_after_s = 0;
	ClaimInput in = *given;
	Waiter waiter;
	waiter_begin(&waiter, in.wait, in.scope, in.key);
	KeyTable kt;
	if (keytable_open(&kt, Access::write, "idem_claim()"))
	{
		fingerprint_request(&kt.catalog, &in);
		last_claim_created = claim_direct(&kt, &in, &waiter, out, last_claim_created);
		keytable_close(&kt);
	}
	else
	{
		fingerprint_request(&kt.catalog, &in);
		claim_with_policies(&kt.catalog, &in, &waiter, out);
	}
	waiter_end(&waiter);
}

// When the attempt on the row was claimed, for its claim-to-finish time (0: not recorded, a key
// claimed before 1.2).
static TimestampTz
attempt_claimed_at(const KeyRow *row)
{
	return row->isnull[COL_CLAIMED_AT] ? 0 : DatumGetTimestampTz(row->value[COL_CLAIMED_AT]);
}

// ---------------------------------------------------------------------------------------------
// Batches (message consumers)

// A key of a batch: its bytes, detoasted once rather than on each comparison, and its index in
// the input.
struct SortedKey
{
	const char *bytes;
	int len;
	int index;
};

static int
compare_bytes(const SortedKey *a, const SortedKey *b)
{
	int c = memcmp(a->bytes, b->bytes, Min(a->len, b->len));
	return c != 0 ? c : (a->len > b->len) - (a->len < b->len);
}

static bool
same_key(const SortedKey *a, const SortedKey *b)
{
	return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

static int
compare_sorted_keys(const void *a, const void *b)
{
	const SortedKey *x = static_cast<const SortedKey *>(a), *y = static_cast<const SortedKey *>(b);
	int c = compare_bytes(x, y);
	return c != 0 ? c : (x->index > y->index) - (x->index < y->index);
}

// The keys in the primary key's order (the key column's collation is "C": byte order), equal keys
// by their place in the input. Every batch takes its keys in this one order, so two batches that
// share keys meet on the first shared one, and neither can hold a key the other waits for while
// waiting itself: no deadlock, whatever the order of the ids in each batch.
static SortedKey *
sorted_keys(int nkeys, const Datum *keys)
{
	SortedKey *sorted = (SortedKey *) palloc(sizeof(SortedKey) * Max(nkeys, 1));
	for (int i = 0; i < nkeys; i++)
	{
		text *k = DatumGetTextPP(keys[i]);
		sorted[i].bytes = VARDATA_ANY(k);
		sorted[i].len = VARSIZE_ANY_EXHDR(k);
		sorted[i].index = i;
	}
	qsort(sorted, nkeys, sizeof(SortedKey), compare_sorted_keys);
	return sorted;
}

// Each key's fingerprint as idem_claim would store it: the one given, or the request's.
static void
batch_fingerprints(const Catalog *c, const BatchClaimInput *in, bool *has, Datum *fingerprint)
{
	for (int i = 0; i < in->nkeys; i++)
	{
		ClaimInput key_in;
		key_in.scope = in->scope;
		key_in.has_fingerprint = in->has_fingerprint != nullptr && in->has_fingerprint[i];
		key_in.fingerprint = key_in.has_fingerprint ? in->fingerprints[i] : (Datum) 0;
		bool has_request = in->request_null != nullptr && !in->request_null[i];
		key_in.request = has_request ? DatumGetJsonbP(in->requests[i]) : nullptr;
		key_in.applied = in->applied;
		fingerprint_request(c, &key_in);
		has[i] = key_in.has_fingerprint;
		fingerprint[i] = key_in.fingerprint;
	}
}

// A key claimed in a short-lived memory context of its own (reset after each key), so that a
// batch of any size needs the memory of one key at a time besides its results.
static MemoryContext
per_key_context()
{
	return AllocSetContextCreate(CurrentMemoryContext, "idempotency batch key", ALLOCSET_DEFAULT_SIZES);
}

void
claim_batch(const BatchClaimInput *in, BatchEmit emit, void *arg)
{
	TimestampTz deadline = in->wait == nullptr ? 0 : add_interval(GetCurrentTimestamp(), in->wait);
	stats_batch_begin(in->scope);
	SortedKey *sorted = sorted_keys(in->nkeys, in->keys);
	KeyTable kt;
	bool direct = keytable_open(&kt, Access::write, "idem_claim_batch()");
	bool *has_fingerprint = (bool *) palloc(sizeof(bool) * Max(in->nkeys, 1));
	Datum *fingerprint = (Datum *) palloc(sizeof(Datum) * Max(in->nkeys, 1));
	batch_fingerprints(&kt.catalog, in, has_fingerprint, fingerprint);
	// A message id repeated within the batch (a redelivery in the same poll) is one key, answered
	// once; repeated with a different request it is refused before anything is written.
	for (int s = 1; s < in->nkeys; s++)
	{
		if (!same_key(&sorted[s - 1], &sorted[s]))
			continue;
		int first = sorted[s - 1].index, next = sorted[s].index;
		bool distinct = has_fingerprint[first] != has_fingerprint[next] ||
		                (has_fingerprint[first] && !bytea_equal(fingerprint[first], fingerprint[next]));
		if (distinct)
		{
			stats_count(Counter::mismatches, in->scope);
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_MISMATCH),
			                errmsg("idempotency key \"%s\" appears twice in argument \"keys\" with different requests",
			                       key_text(in->keys[next])),
			                errdetail("keys[%d] and keys[%d] are the same key.", in->position[Min(first, next)],
			                          in->position[Max(first, next)])));
		}
	}

	if (direct)
	{
		keytable_prepare_write(&kt);
		// Where each row was written, for the completion in this transaction; applied keys are
		// finished already.
		if (!in->applied)
			keytable_batch_begin(&kt, in->scope, in->nkeys);
	}
	MemoryContext key_cxt = per_key_context();
	BatchGuess guess;
	for (int s = 0; s < in->nkeys; s++)
	{
		if (s > 0 && same_key(&sorted[s - 1], &sorted[s]))
			continue;
		int i = sorted[s].index;
		CHECK_FOR_INTERRUPTS();
		MemoryContext caller_cxt = MemoryContextSwitchTo(key_cxt);
		ClaimInput key_in;
		key_in.scope = in->scope;
		key_in.key = in->keys[i];
		key_in.has_fingerprint = has_fingerprint[i];
		key_in.fingerprint = fingerprint[i];
		key_in.request = nullptr;
		key_in.ttl = in->ttl;
		key_in.lease = in->lease;
		key_in.wait = in->wait;
		key_in.applied = in->applied;
		stats_count(Counter::claims, in->scope);
		ClaimOutput out;
		out.retry_after = nullptr;
		out.retry_after_s = 0;
		Waiter waiter;
		waiter_begin(&waiter, nullptr, in->scope, in->keys[i]);
		waiter.bounded = in->wait != nullptr;
		waiter.deadline = deadline;
		if (direct)
		{
			guess.note(claim_direct(&kt, &key_in, &waiter, &out, guess.insert_first));
			if (!in->applied)
				keytable_batch_note(&kt, in->scope, in->keys[i]);
		}
		else
			claim_with_policies(&kt.catalog, &key_in, &waiter, &out);
		waiter_end(&waiter);
		emit(arg, i, &out);
		if (direct)
			keytable_clear(&kt);
		MemoryContextSwitchTo(caller_cxt);
		MemoryContextReset(key_cxt);
	}
	MemoryContextDelete(key_cxt);
	if (direct)
	{
		keytable_close(&kt);
		last_claim_created = guess.insert_first;
	}
	pfree(sorted);
	stats_batch_end();
}

int64
finish_batch(const BatchFinishInput *in)
{
	SortedKey *sorted = sorted_keys(in->nkeys, in->keys);
	// Each key the batch claimed is finished once: a repeated key is a mistake in the caller's
	// list, refused before anything is written (its second finish would be IK004).
	for (int s = 1; s < in->nkeys; s++)
	{
		int first = sorted[s - 1].index, next = sorted[s].index;
		if (same_key(&sorted[s - 1], &sorted[s]))
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("argument \"keys\" repeats idempotency key \"%s\"", key_text(in->keys[next])),
			                errdetail("keys[%d] and keys[%d] are the same key.", in->position[Min(first, next)],
			                          in->position[Max(first, next)])));
	}

	KeyTable kt;
	bool direct = keytable_open(&kt, Access::write, "idem_complete_batch()");
	if (direct)
		keytable_prepare_write(&kt);
	MemoryContext key_cxt = per_key_context();
	for (int s = 0; s < in->nkeys; s++)
	{
		int i = sorted[s].index;
		CHECK_FOR_INTERRUPTS();
		MemoryContext caller_cxt = MemoryContextSwitchTo(key_cxt);
		FinishInput key_in;
		key_in.scope = in->scope;
		key_in.key = in->keys[i];
		key_in.to = STATE_SUCCEEDED;
		key_in.response_null = in->response_null == nullptr || in->response_null[i];
		key_in.response = key_in.response_null ? (Datum) 0 : in->responses[i];
		key_in.response_code = in->response_code;
		key_in.retryable = false;
		key_in.has_attempt = in->has_attempt != nullptr && in->has_attempt[i];
		key_in.attempt = key_in.has_attempt ? in->attempts[i] : 0;
		key_in.ttl = in->ttl;
		key_in.body_null = true;
		key_in.body = (Datum) 0;
		key_in.headers_null = true;
		key_in.headers = (Datum) 0;
		TimestampTz claimed_at = 0;
		auto change = [&](KeyRow *row) {
			claimed_at = attempt_claimed_at(row);
			finish_row(&kt.catalog, &key_in, row);
		};
		if (direct)
			(void) update_direct(&kt, key_in.scope, key_in.key, change);
		else
			(void) update_with_policies(&kt.catalog, key_in.scope, key_in.key, change);
		stats_finished(Counter::completes, key_in.scope, claimed_at);
		wake_at_commit(key_in.scope, key_in.key);
		if (direct)
			keytable_clear(&kt);
		MemoryContextSwitchTo(caller_cxt);
		MemoryContextReset(key_cxt);
	}
	MemoryContextDelete(key_cxt);
	if (direct)
		keytable_close(&kt);
	pfree(sorted);
	return in->nkeys;
}

Datum
finish(const FinishInput *in)
{
	const char *caller = in->to == STATE_SUCCEEDED ? "idem_complete()" : "idem_fail()";
	KeyTable kt;
	Datum finished;
	TimestampTz claimed_at = 0;
	auto change = [&](KeyRow *row) {
		claimed_at = attempt_claimed_at(row);
		finish_row(&kt.catalog, in, row);
	};
	if (keytable_open(&kt, Access::write, caller))
	{
		finished = update_direct(&kt, in->scope, in->key, change);
		keytable_close(&kt);
	}
	else
		finished = update_with_policies(&kt.catalog, in->scope, in->key, change);
	stats_finished(in->to == STATE_SUCCEEDED ? Counter::completes : Counter::fails, in->scope, claimed_at);
	wake_at_commit(in->scope, in->key);
	return finished;
}

Datum
set_lease(const LeaseInput *in)
{
	const char *caller = in->lease != nullptr ? "idem_extend()" : "idem_release()";
	KeyTable kt;
	Datum written;
	TimestampTz claimed_at = 0;
	auto change = [&](KeyRow *row) {
		claimed_at = attempt_claimed_at(row);
		lease_row(&kt.catalog, in, row);
	};
	if (keytable_open(&kt, Access::update, caller))
	{
		written = update_direct(&kt, in->scope, in->key, change);
		keytable_close(&kt);
	}
	else
		written = update_with_policies(&kt.catalog, in->scope, in->key, change);
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
	KeyTable kt;
	bool deleted;
	if (keytable_open(&kt, Access::forget, "idem_forget()"))
	{
		deleted = delete_direct(&kt, scope, key,
		                        [&](const KeyRow *row) { check_forgettable(&kt.catalog, key, force, row); });
		keytable_close(&kt);
	}
	else
		deleted = delete_with_policies(&kt.catalog, scope, key,
		                               [&](const KeyRow *row) { check_forgettable(&kt.catalog, key, force, row); });
	if (deleted)
		wake_at_commit(scope, key);
	return deleted;
}

bool
lookup(Datum scope, Datum key, Datum *row)
{
	KeyTable kt;
	bool found;
	if (!keytable_open(&kt, Access::read, "idem_lookup()"))
	{
		PolicySql ps;
		policy_begin(&ps, &kt.catalog);
		KeyRow stored;
		found = policy_fetch(&ps, scope, key, false, &stored, nullptr, row) &&
		        !expired(&kt.catalog, &stored, clock_now());
		policy_end(&ps);
		return found;
	}
	Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
	found = keytable_find_visible(&kt, scope, key, snapshot);
	if (found)
	{
		KeyRow stored;
		keytable_read(&kt, kt.found, &stored);
		found = !expired(&kt.catalog, &stored, clock_now());
	}
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
		// As reap_direct: the policies decide which keys this caller deletes, not which ranges
		// get summaries; without them a scan of the index reads the new ranges whole.
		(void) keytable_summarize_new_ranges_unopened(&kt.catalog);
		PolicySql ps;
		policy_begin(&ps, &kt.catalog);
		reaped = policy_reap(&ps, clock_now(), max_rows);
		policy_end(&ps);
	}
	stats_reaped(reaped);
	return reaped;
}

} // namespace idem
