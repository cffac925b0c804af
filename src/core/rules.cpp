#include "core/rules.hpp"

#include "common/errors.hpp"
#include "common/fingerprint.hpp"
#include "common/settings.hpp"
#include "stats/scopestats.hpp"
#include "stats/stats.hpp"

namespace idem {

TimestampTz
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

const char *
key_text(Datum key)
{
	return text_to_cstring(DatumGetTextPP(key));
}

bool
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

void
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

void
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

void
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

Step
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

void
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

// docs/contract.md §9.5: whole seconds after which a retry of an in_progress key is useful, at
// least 1 and at most the lease left, rounded up. The one place for that estimate. Once the scope's
// statistics know how long its attempts take (scope_stats_work_times), the attempt is expected to
// end at its claimed_at + the scope's p90; past that, at claimed_at + p99; past both, nothing
// better than the lease's end is known. Until then (or with idempotency.track off, or without
// preload): the lease left.
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

void
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
// retry_after_s (docs/contract.md §9.5).
void
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

void
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

void
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
	// docs/contract.md §9.2: the result's own lifetime, counted from its completion.
	if (in->ttl != nullptr)
		set_timestamp(row, COL_EXPIRES_AT, duration_end(now, in->ttl, "ttl"));
}

void
lease_row(const Catalog *c, const LeaseInput *in, KeyRow *row)
{
	TimestampTz now = clock_now();
	check_owner(c, in->key, true, in->attempt, row, now);
	set_timestamp(row, COL_LOCKED_UNTIL, in->lease != nullptr ? duration_end(now, in->lease, "lease") : now);
}

void
check_forgettable(const Catalog *c, Datum key, bool force, const KeyRow *row)
{
	if (!force && live_lease(c, row, clock_now()))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_IN_PROGRESS),
		                errmsg("idempotency key \"%s\" is in progress", key_text(key)),
		                errdetail("Its lease of attempt %d has not ended.",
		                          DatumGetInt32(row->value[COL_ATTEMPT])),
		                errhint("Wait for the lease to end, or pass force => true.")));
}

// The request's fingerprint in the form the installed version stores: 1.1's until ALTER EXTENSION
// UPDATE has run, so that the library behaves as the version its SQL objects belong to.
void
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

} // namespace idem
