#include "core/keystate.hpp"

#include "common/errors.hpp"
#include "common/settings.hpp"
#include "stats/stats.hpp"

namespace idem {

// Leases and expiry are wall-clock time, not the transaction's start.
static TimestampTz
clock_now()
{
	return GetCurrentTimestamp();
}

static TimestampTz
plus(TimestampTz t, const Interval *interval, int64 default_usecs)
{
	if (interval == nullptr)
		return t + default_usecs;
	return DatumGetTimestampTz(
	    DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(t), PointerGetDatum(interval)));
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
row_in_state(const KeyTable *kt, const KeyRow *row, KeyState state)
{
	return DatumGetObjectId(row->value[COL_STATE]) == kt->catalog.state_label[state];
}

static void
set_state(const KeyTable *kt, KeyRow *row, KeyState state)
{
	row->value[COL_STATE] = ObjectIdGetDatum(kt->catalog.state_label[state]);
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

// ON CONFLICT's rule at REPEATABLE READ and above: a committed version the transaction's
// snapshot cannot see is a serialization failure, not something to act on.
static void
check_serializable(KeyTable *kt)
{
	if (IsolationUsesXactSnapshot() && !keytable_found_visible_to(kt, GetTransactionSnapshot()))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
		                errmsg("could not serialize access due to concurrent update")));
}

static void
serialization_failure_after(TM_Result result)
{
	if (IsolationUsesXactSnapshot())
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
		                errmsg("could not serialize access due to concurrent %s",
		                       result == TM_Deleted ? "delete" : "update")));
}

static void
new_row(const KeyTable *kt, const ClaimInput *in, TimestampTz now, KeyRow *row)
{
	for (int c = 0; c < NUM_COLUMNS; c++)
		set_null(row, (Column) c);
	row->value[COL_SCOPE] = in->scope;
	row->isnull[COL_SCOPE] = false;
	row->value[COL_KEY] = in->key;
	row->isnull[COL_KEY] = false;
	set_state(kt, row, STATE_PENDING);
	row->value[COL_ATTEMPT] = Int32GetDatum(1);
	row->isnull[COL_ATTEMPT] = false;
	if (in->has_fingerprint)
	{
		row->value[COL_FINGERPRINT] = in->fingerprint;
		row->isnull[COL_FINGERPRINT] = false;
	}
	set_timestamp(row, COL_CREATED_AT, now);
	set_timestamp(row, COL_LOCKED_UNTIL, plus(now, in->lease, setting_default_lease_ms * INT64CONST(1000)));
	set_timestamp(row, COL_EXPIRES_AT, plus(now, in->ttl, setting_default_ttl_s * USECS_PER_SEC));
}

// A new lease on an abandoned or retryable key: the fencing token moves on, the old outcome goes.
static void
takeover_row(const KeyTable *kt, const ClaimInput *in, TimestampTz now, KeyRow *row)
{
	int32 attempt = DatumGetInt32(row->value[COL_ATTEMPT]);
	if (attempt == PG_INT32_MAX)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
		                errmsg("idempotency key \"%s\" has been taken over too many times", key_text(in->key))));
	row->value[COL_ATTEMPT] = Int32GetDatum(attempt + 1);
	set_state(kt, row, STATE_PENDING);
	set_null(row, COL_RESPONSE);
	set_null(row, COL_RESPONSE_CODE);
	set_null(row, COL_RETRYABLE);
	set_null(row, COL_COMPLETED_AT);
	set_timestamp(row, COL_LOCKED_UNTIL, plus(now, in->lease, setting_default_lease_ms * INT64CONST(1000)));
	TimestampTz expires = plus(now, in->ttl, setting_default_ttl_s * USECS_PER_SEC);
	if (expires > DatumGetTimestampTz(row->value[COL_EXPIRES_AT]))
		set_timestamp(row, COL_EXPIRES_AT, expires);
}

// The result must outlive the pinned buffer the row was read from.
static void
copy_out(const KeyTable *kt, const KeyRow *row, ClaimOutput *out)
{
	TupleDesc desc = RelationGetDescr(kt->rel);
	for (int c = 0; c < NUM_COLUMNS; c++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, kt->catalog.attnum[c] - 1);
		out->row.isnull[c] = row->isnull[c];
		out->row.value[c] =
		    row->isnull[c] ? (Datum) 0 : datumCopy(row->value[c], att->attbyval, att->attlen);
	}
}

void
claim(const ClaimInput *in, ClaimOutput *out)
{
	KeyTable kt;
	keytable_open(&kt, Access::write, "idem_claim()");
	stats_count(Counter::claims);
	out->inserted = false;
	out->retry_after = nullptr;

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row;
		if (!keytable_find_latest(&kt, in->scope, in->key))
		{
			new_row(&kt, in, clock_now(), &row);
			if (!keytable_insert(&kt, &row))
				continue; // a concurrent insert won; look again and wait for it
			out->outcome = Outcome::claimed;
			out->inserted = true;
			stats_count(Counter::inserted);
			copy_out(&kt, &row, out);
			CommandCounterIncrement();
			break;
		}

		bool own = TransactionIdIsCurrentTransactionId(keytable_found_xmin(&kt));
		if (!own)
			check_serializable(&kt);
		keytable_read(&kt, kt.found, &row);
		bool mismatch = fingerprints_distinct(&row, in);
		stats_count(Counter::mismatches, mismatch);
		if (mismatch)
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_MISMATCH),
			                errmsg("idempotency key \"%s\" was already used with a different request",
			                       key_text(in->key)),
			                errhint("Use a new idempotency key for a different request.")));

		bool pending = row_in_state(&kt, &row, STATE_PENDING);
		TimestampTz now = clock_now();
		bool terminal = row_in_state(&kt, &row, STATE_SUCCEEDED) ||
		                (row_in_state(&kt, &row, STATE_FAILED) &&
		                 !(!row.isnull[COL_RETRYABLE] && DatumGetBool(row.value[COL_RETRYABLE])));
		bool lease_live = pending && !row.isnull[COL_LOCKED_UNTIL] &&
		                  DatumGetTimestampTz(row.value[COL_LOCKED_UNTIL]) > now;

		// This transaction wrote the row: it is the owner, whatever the clock says.
		if (own)
		{
			out->outcome = pending ? Outcome::claimed : Outcome::replay;
			stats_count(Counter::replays, !pending);
			copy_out(&kt, &row, out);
			break;
		}
		if (terminal)
		{
			out->outcome = Outcome::replay;
			stats_count(Counter::replays);
			copy_out(&kt, &row, out);
			break;
		}
		if (lease_live)
		{
			out->outcome = Outcome::in_progress;
			stats_count(Counter::in_progress);
			out->retry_after = DatumGetIntervalP(DirectFunctionCall2(
			    timestamp_mi, row.value[COL_LOCKED_UNTIL], TimestampTzGetDatum(now)));
			copy_out(&kt, &row, out);
			break;
		}

		takeover_row(&kt, in, now, &row);
		TM_Result result = keytable_update(&kt, &row);
		if (result != TM_Ok)
		{
			serialization_failure_after(result);
			continue; // changed since we read it: decide again on the new version
		}
		out->outcome = Outcome::claimed;
		stats_count(Counter::takeovers);
		copy_out(&kt, &row, out);
		CommandCounterIncrement();
		break;
	}
	keytable_close(&kt);
}

static const char *
state_name(const KeyTable *kt, const KeyRow *row)
{
	return row_in_state(kt, row, STATE_SUCCEEDED) ? "succeeded"
	       : row_in_state(kt, row, STATE_FAILED)  ? "failed"
	                                              : "pending";
}

Datum
finish(const FinishInput *in)
{
	KeyTable kt;
	keytable_open(&kt, Access::write,
	              in->to == STATE_SUCCEEDED ? "idem_complete()" : "idem_fail()");
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (!keytable_find_latest(&kt, in->scope, in->key))
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
			                errmsg("idempotency key \"%s\" does not exist", key_text(in->key))));
		if (!TransactionIdIsCurrentTransactionId(keytable_found_xmin(&kt)))
			check_serializable(&kt);

		KeyRow row;
		keytable_read(&kt, kt.found, &row);
		int32 attempt = DatumGetInt32(row.value[COL_ATTEMPT]);
		if (in->has_attempt && in->attempt != attempt)
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_ATTEMPT_STALE),
			                errmsg("attempt %d of idempotency key \"%s\" is stale", in->attempt,
			                       key_text(in->key)),
			                attempt > 1
			                    ? errdetail("The key was taken over; its current attempt is %d.", attempt)
			                    : errdetail("The key has not been taken over; its current attempt is %d.", attempt)));
		if (!row_in_state(&kt, &row, STATE_PENDING))
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_IDEM_KEY_NOT_PENDING),
			                errmsg("idempotency key \"%s\" is not pending", key_text(in->key)),
			                errdetail("The key is already finished; its state is %s.", state_name(&kt, &row))));

		set_state(&kt, &row, in->to);
		row.value[COL_RESPONSE] = in->response;
		row.isnull[COL_RESPONSE] = in->response_null;
		row.value[COL_RESPONSE_CODE] = Int32GetDatum(in->response_code);
		row.isnull[COL_RESPONSE_CODE] = false;
		if (in->to == STATE_FAILED)
		{
			row.value[COL_RETRYABLE] = BoolGetDatum(in->retryable);
			row.isnull[COL_RETRYABLE] = false;
		}
		else
			set_null(&row, COL_RETRYABLE);
		set_timestamp(&row, COL_COMPLETED_AT, clock_now());
		set_null(&row, COL_LOCKED_UNTIL);

		TM_Result result = keytable_update(&kt, &row);
		if (result == TM_Ok)
			break;
		serialization_failure_after(result);
	}
	CommandCounterIncrement();
	stats_count(in->to == STATE_SUCCEEDED ? Counter::completes : Counter::fails);
	Datum finished = keytable_written_datum(&kt);
	keytable_close(&kt);
	return finished;
}

bool
lookup(Datum scope, Datum key, Datum *row)
{
	KeyTable kt;
	keytable_open(&kt, Access::read, "idem_lookup()");
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
	keytable_open(&kt, Access::reap, "idem_reap()");
	TimestampTz now = clock_now();
	Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
	ExpiryScan scan;
	keytable_expiry_begin(&kt, &scan, now, snapshot);
	int64 reaped = 0;
	while (reaped < max_rows && keytable_expiry_next(&kt, &scan))
	{
		CHECK_FOR_INTERRUPTS();
		KeyRow row;
		keytable_read(&kt, kt.found, &row);
		// A live lease means someone is working on the key right now.
		if (row_in_state(&kt, &row, STATE_PENDING) && !row.isnull[COL_LOCKED_UNTIL] &&
		    DatumGetTimestampTz(row.value[COL_LOCKED_UNTIL]) > now)
			continue;
		// Rows another transaction holds are skipped, never waited for.
		if (keytable_delete_unless_busy(&kt))
			reaped++;
	}
	keytable_expiry_end(&scan);
	UnregisterSnapshot(snapshot);
	stats_reaped(reaped);
	if (reaped > 0)
		CommandCounterIncrement();
	keytable_close(&kt);
	return reaped;
}

} // namespace idem
