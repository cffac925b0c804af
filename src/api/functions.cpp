// The SQL-callable functions: argument checks (docs/contract.md §4), then the key-state logic in
// core/.
#include "common/guard.hpp"
#include "common/settings.hpp"
#include "core/keystate.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/tuplestore.h"
}

namespace {

using namespace idem;

constexpr int max_scope_bytes = 255;
constexpr int max_fingerprint_bytes = 64;

void
reject_null(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
		                errmsg("argument \"%s\" must not be null", name)));
}

// The argument, or its array element, that an error is about: formatted only for the error, not
// for each element of a batch.
const char *
argument_name(const char *name, const int *element)
{
	if (element == nullptr)
		return psprintf("argument \"%s\"", name);
	return psprintf("element %d of argument \"%s\"", *element, name);
}

// docs/contract.md §4 for one key: argument `name`, or its element `*element`.
void
check_key(text *key, const char *name, const int *element = nullptr)
{
	const unsigned char *bytes = (const unsigned char *) VARDATA_ANY(key);
	int len = VARSIZE_ANY_EXHDR(key);
	// The IETF Idempotency-Key header's characters: printable ASCII.
	for (int i = 0; i < len; i++)
	{
		if (bytes[i] < 0x20 || bytes[i] > 0x7E)
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("%s must contain only printable ASCII characters", argument_name(name, element)),
			                errdetail("Byte %d is 0x%02X.", i + 1, bytes[i])));
	}
	if (len < 1 || len > setting_max_key_length)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("%s must be 1 to %d characters long", argument_name(name, element), setting_max_key_length),
		                errdetail("It is %d characters long.", len)));
}

Datum
key_arg(FunctionCallInfo fcinfo, int arg)
{
	reject_null(fcinfo, arg, "key");
	text *key = PG_GETARG_TEXT_PP(arg);
	check_key(key, "key");
	return PointerGetDatum(key);
}

Datum
scope_arg(FunctionCallInfo fcinfo, int arg)
{
	reject_null(fcinfo, arg, "scope");
	text *scope = PG_GETARG_TEXT_PP(arg);
	if (VARSIZE_ANY_EXHDR(scope) > max_scope_bytes)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("argument \"scope\" must be at most %d bytes long", max_scope_bytes),
		                errdetail("It is %d bytes long.", (int) VARSIZE_ANY_EXHDR(scope))));
	return PointerGetDatum(scope);
}

// NULL means "use the setting". Checked now, with the call's clock, so that a bad interval is
// refused before anything is read; the lease and expiry themselves start when the claim writes.
const Interval *
duration_arg(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		return nullptr;
	Interval *value = PG_GETARG_INTERVAL_P(arg);
	(void) duration_end(GetCurrentTimestamp(), value, name);
	return value;
}

// docs/contract.md §9.3: from 0 (never block on another transaction) to 1 hour; NULL waits as 1.1
// did. Checked on the calendar like the other intervals.
const Interval *
wait_arg(FunctionCallInfo fcinfo, int arg)
{
	if (PG_ARGISNULL(arg))
		return nullptr;
	static const Interval zero = {0, 0, 0};
	static const Interval one_hour = {USECS_PER_HOUR, 0, 0};
	Interval *value = PG_GETARG_INTERVAL_P(arg);
	bool valid = DatumGetBool(DirectFunctionCall2(interval_ge, PointerGetDatum(value), PointerGetDatum(&zero))) &&
	             DatumGetBool(DirectFunctionCall2(interval_le, PointerGetDatum(value), PointerGetDatum(&one_hour)));
	if (valid)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz end = DatumGetTimestampTz(DirectFunctionCall2(
		    timestamptz_pl_interval, TimestampTzGetDatum(now), PointerGetDatum(value)));
		valid = end >= now && end - now <= USECS_PER_HOUR;
	}
	if (!valid)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("argument \"wait\" must be an interval from 0 to 1 hour")));
	return value;
}

// 1.2's headers: a JSON object (name to value), so that a client can set them one by one.
void
headers_arg(FunctionCallInfo fcinfo, int arg, FinishInput *in)
{
	in->headers_null = PG_ARGISNULL(arg);
	in->headers = in->headers_null ? (Datum) 0 : PG_GETARG_DATUM(arg);
	if (!in->headers_null && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(arg)))
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("argument \"headers\" must be a JSON object")));
}

// The arguments 1.2 added to idem_complete and idem_fail (ttl, body, headers), from `first` on.
// Called through 1.1's signature (the extension not updated yet), they are absent: as in 1.1.
void
finish_1_2_args(FunctionCallInfo fcinfo, int first, FinishInput *in)
{
	in->ttl = nullptr;
	in->body_null = true;
	in->body = (Datum) 0;
	in->headers_null = true;
	in->headers = (Datum) 0;
	if (PG_NARGS() <= first)
		return;
	in->ttl = duration_arg(fcinfo, first, "ttl");
	in->body_null = PG_ARGISNULL(first + 1);
	in->body = in->body_null ? (Datum) 0 : PG_GETARG_DATUM(first + 1);
	headers_arg(fcinfo, first + 2, in);
}

// idem_outcome's labels' OIDs, in Outcome's order.
void
outcome_labels(Oid outcome_type, Oid *label)
{
	static const char *const labels[] = {"claimed", "replay", "in_progress"};
	for (int i = 0; i < (int) Outcome::count; i++)
	{
		HeapTuple tuple = SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(outcome_type),
		                                  CStringGetDatum(labels[i]));
		if (!HeapTupleIsValid(tuple))
			elog(ERROR, "idempotency: label \"%s\" of idem_outcome not found", labels[i]);
		label[i] = ((Form_pg_enum) GETSTRUCT(tuple))->oid;
		ReleaseSysCache(tuple);
	}
}

// idem_claim_result's type and idem_outcome's labels, looked up once per backend rather than per
// call site: every execution of a prepared statement starts with a fresh call site, and the
// lookups (result type, tuple descriptor, three labels) cost a claim more than its primary key
// probe. The type cache tells when idem_claim_result changed (ALTER EXTENSION UPDATE, DROP and
// CREATE EXTENSION): a new descriptor identifier, and the labels are looked up again.
struct ClaimResultType
{
	Oid type;
	uint64 identifier;
	Oid outcome_label[(int) Outcome::count];
};
ClaimResultType claim_result = {InvalidOid, 0, {}};

// idem_claim_result's descriptor from the type cache (valid until the next catalog invalidation
// is processed: use it at once) and its labels in *labels.
TupleDesc
claim_result_desc(FunctionCallInfo fcinfo, const Oid **labels)
{
	Oid type = get_fn_expr_rettype(fcinfo->flinfo);
	if (!OidIsValid(type))
		type = get_func_rettype(fcinfo->flinfo->fn_oid);
	TypeCacheEntry *entry = lookup_type_cache(type, TYPECACHE_TUPDESC);
	if (entry->tupDesc == nullptr)
		elog(ERROR, "idempotency: idem_claim must return a composite type");
	if (type != claim_result.type || entry->tupDesc_identifier != claim_result.identifier)
	{
		claim_result.type = InvalidOid;
		outcome_labels(TupleDescAttr(entry->tupDesc, 0)->atttypid, claim_result.outcome_label);
		claim_result.type = type;
		claim_result.identifier = entry->tupDesc_identifier;
	}
	*labels = claim_result.outcome_label;
	return entry->tupDesc;
}

Datum
row_or_null(FunctionCallInfo fcinfo, bool found, Datum row)
{
	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(row);
}

} // namespace

IDEM_SQL_FUNCTION(idem_claim)
{
	ClaimInput in;
	in.key = key_arg(fcinfo, 0);
	in.scope = scope_arg(fcinfo, 2);
	in.ttl = duration_arg(fcinfo, 3, "ttl");
	in.lease = duration_arg(fcinfo, 4, "lease");
	in.wait = PG_NARGS() > 6 ? wait_arg(fcinfo, 6) : nullptr;
	in.applied = false;
	in.has_fingerprint = false;
	in.request = nullptr;
	if (!PG_ARGISNULL(5))
	{
		bytea *given = PG_GETARG_BYTEA_PP(5);
		int len = VARSIZE_ANY_EXHDR(given);
		if (len < 1 || len > max_fingerprint_bytes)
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("argument \"fingerprint\" must be 1 to %d bytes long", max_fingerprint_bytes),
			                errdetail("It is %d bytes long.", len)));
		in.has_fingerprint = true;
		in.fingerprint = PointerGetDatum(given);
	}
	else if (!PG_ARGISNULL(1))
		in.request = PG_GETARG_JSONB_P(1); // fingerprinted by claim(), as the table's version stores it

	ClaimOutput out;
	claim(&in, &out);

	const Oid *labels;
	TupleDesc desc = claim_result_desc(fcinfo, &labels);
	// 1.1's idem_claim_result has the first 8 attributes, 1.2's all 11.
	Datum values[11];
	bool isnull[11] = {false, false, false, false, false, false, false, false, false, false, false};
	values[0] = ObjectIdGetDatum(labels[(int) out.outcome]);
	values[1] = BoolGetDatum(out.inserted);
	values[2] = Int32GetDatum(out.attempt);
	isnull[2] = out.unseen;
	values[3] = out.state;
	isnull[3] = out.unseen;
	values[4] = out.response;
	isnull[4] = out.response_null;
	values[5] = Int32GetDatum(out.response_code);
	isnull[5] = out.response_code_null;
	values[6] = PointerGetDatum(out.retry_after);
	isnull[6] = out.retry_after == nullptr;
	values[7] = TimestampTzGetDatum(out.expires_at);
	isnull[7] = out.unseen;
	values[8] = Int32GetDatum(out.retry_after_s);
	isnull[8] = out.outcome != Outcome::in_progress;
	values[9] = out.response_body;
	isnull[9] = out.response_body_null;
	values[10] = out.response_headers;
	isnull[10] = out.response_headers_null;
	if (desc->natts != 8 && desc->natts != 11)
		elog(ERROR, "idempotency: idem_claim_result has %d attributes", desc->natts);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, isnull)));
}

// idem_complete(key, response, response_code, scope, attempt[, ttl, body, headers])
IDEM_SQL_FUNCTION(idem_complete)
{
	FinishInput in;
	in.key = key_arg(fcinfo, 0);
	// 1.1 required a response; 1.2 stores none as well (e.g. 204 No Content).
	if (PG_NARGS() <= 5)
		reject_null(fcinfo, 1, "response");
	in.response_null = PG_ARGISNULL(1);
	in.response = in.response_null ? (Datum) 0 : PG_GETARG_DATUM(1);
	reject_null(fcinfo, 2, "response_code");
	in.response_code = PG_GETARG_INT32(2);
	in.scope = scope_arg(fcinfo, 3);
	in.has_attempt = !PG_ARGISNULL(4);
	in.attempt = in.has_attempt ? PG_GETARG_INT32(4) : 0;
	in.to = STATE_SUCCEEDED;
	in.retryable = false;
	finish_1_2_args(fcinfo, 5, &in);
	PG_RETURN_DATUM(finish(&in));
}

// idem_fail(key, response, response_code, retryable, scope, attempt[, ttl, body, headers])
IDEM_SQL_FUNCTION(idem_fail)
{
	FinishInput in;
	in.key = key_arg(fcinfo, 0);
	in.response_null = PG_ARGISNULL(1);
	in.response = in.response_null ? (Datum) 0 : PG_GETARG_DATUM(1);
	reject_null(fcinfo, 2, "response_code");
	in.response_code = PG_GETARG_INT32(2);
	reject_null(fcinfo, 3, "retryable");
	in.retryable = PG_GETARG_BOOL(3);
	in.scope = scope_arg(fcinfo, 4);
	in.has_attempt = !PG_ARGISNULL(5);
	in.attempt = in.has_attempt ? PG_GETARG_INT32(5) : 0;
	in.to = STATE_FAILED;
	finish_1_2_args(fcinfo, 6, &in);
	PG_RETURN_DATUM(finish(&in));
}

// idem_extend(key, attempt, lease, scope)
IDEM_SQL_FUNCTION(idem_extend)
{
	LeaseInput in;
	in.key = key_arg(fcinfo, 0);
	reject_null(fcinfo, 1, "attempt");
	in.attempt = PG_GETARG_INT32(1);
	reject_null(fcinfo, 2, "lease");
	in.lease = duration_arg(fcinfo, 2, "lease");
	in.scope = scope_arg(fcinfo, 3);
	PG_RETURN_DATUM(set_lease(&in));
}

// idem_release(key, attempt, scope)
IDEM_SQL_FUNCTION(idem_release)
{
	LeaseInput in;
	in.key = key_arg(fcinfo, 0);
	reject_null(fcinfo, 1, "attempt");
	in.attempt = PG_GETARG_INT32(1);
	in.lease = nullptr;
	in.scope = scope_arg(fcinfo, 2);
	PG_RETURN_DATUM(set_lease(&in));
}

// idem_forget(key, scope, force)
IDEM_SQL_FUNCTION(idem_forget)
{
	Datum key = key_arg(fcinfo, 0);
	Datum scope = scope_arg(fcinfo, 1);
	reject_null(fcinfo, 2, "force");
	PG_RETURN_BOOL(forget(scope, key, PG_GETARG_BOOL(2)));
}

IDEM_SQL_FUNCTION(idem_lookup)
{
	Datum key = key_arg(fcinfo, 0);
	Datum scope = scope_arg(fcinfo, 1);
	Datum row;
	bool found = lookup(scope, key, &row);
	return row_or_null(fcinfo, found, row);
}

IDEM_SQL_FUNCTION(idem_reap)
{
	int32 max_rows = setting_reaper_batch_size;
	if (!PG_ARGISNULL(0))
	{
		max_rows = PG_GETARG_INT32(0);
		if (max_rows < 1)
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			                errmsg("argument \"max_rows\" must be at least 1")));
	}
	PG_RETURN_INT64(reap(max_rows));
}

// ---------------------------------------------------------------------------------------------
// Batches (message consumers)

namespace {

// A one-dimensional array argument's elements (an empty array has none); NULL → 22004.
struct ArrayArg
{
	int n;
	int lower;     // the first element's subscript, for messages
	Datum *value;
	bool *isnull;
};

void
array_arg(FunctionCallInfo fcinfo, int arg, const char *name, Oid element_type, ArrayArg *out)
{
	reject_null(fcinfo, arg, name);
	ArrayType *array = PG_GETARG_ARRAYTYPE_P(arg);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("argument \"%s\" must be a one-dimensional array", name)));
	int16 typlen;
	bool typbyval;
	char typalign;
	get_typlenbyvalalign(element_type, &typlen, &typbyval, &typalign);
	deconstruct_array(array, element_type, typlen, typbyval, typalign, &out->value, &out->isnull, &out->n);
	out->lower = ARR_NDIM(array) == 1 ? ARR_LBOUND(array)[0] : 1;
}

// An optional per-key array: absent (NULL) or exactly one element per key.
bool
per_key_array_arg(FunctionCallInfo fcinfo, int arg, const char *name, Oid element_type,
                  const ArrayArg *keys, ArrayArg *out)
{
	if (PG_ARGISNULL(arg))
		return false;
	array_arg(fcinfo, arg, name, element_type, out);
	if (out->n != keys->n)
		ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		                errmsg("argument \"%s\" must have one element per key", name),
		                errdetail("\"keys\" has %d elements, \"%s\" has %d.", keys->n, name, out->n)));
	return true;
}

// Every key checked (docs/contract.md §4) before anything is read or written; an error names the
// element.
void
keys_arg(FunctionCallInfo fcinfo, int arg, ArrayArg *keys, int **position)
{
	array_arg(fcinfo, arg, "keys", TEXTOID, keys);
	*position = (int *) palloc(sizeof(int) * Max(keys->n, 1));
	for (int i = 0; i < keys->n; i++)
	{
		int subscript = keys->lower + i;
		(*position)[i] = subscript;
		if (keys->isnull[i])
			ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			                errmsg("element %d of argument \"keys\" must not be null", subscript)));
		text *key = DatumGetTextPP(keys->value[i]);
		keys->value[i] = PointerGetDatum(key);
		check_key(key, "keys", &subscript);
	}
}

struct BatchResult
{
	ReturnSetInfo *rsinfo;
	const Datum *keys;
	Oid outcome_label[(int) Outcome::count];
};

// One row of idem_claim_batch: (key, outcome, inserted, attempt, state, response, response_code,
// retry_after_s, expires_at).
void
emit_claim_row(void *arg, int index, const ClaimOutput *out)
{
	BatchResult *result = static_cast<BatchResult *>(arg);
	Datum values[9];
	bool isnull[9] = {false, false, false, false, false, false, false, false, false};
	values[0] = result->keys[index];
	values[1] = ObjectIdGetDatum(result->outcome_label[(int) out->outcome]);
	values[2] = BoolGetDatum(out->inserted);
	values[3] = Int32GetDatum(out->attempt);
	isnull[3] = out->unseen;
	values[4] = out->state;
	isnull[4] = out->unseen;
	values[5] = out->response;
	isnull[5] = out->response_null;
	values[6] = Int32GetDatum(out->response_code);
	isnull[6] = out->response_code_null;
	values[7] = Int32GetDatum(out->retry_after_s);
	isnull[7] = out->outcome != Outcome::in_progress;
	values[8] = TimestampTzGetDatum(out->expires_at);
	isnull[8] = out->unseen;
	tuplestore_putvalues(result->rsinfo->setResult, result->rsinfo->setDesc, values, isnull);
}

constexpr int claim_batch_columns = 9;

} // namespace

// idem_claim_batch(keys, scope, requests, fingerprints, ttl, lease, wait, applied)
IDEM_SQL_FUNCTION(idem_claim_batch)
{
	ArrayArg keys;
	BatchClaimInput in;
	int *position;
	keys_arg(fcinfo, 0, &keys, &position);
	in.scope = scope_arg(fcinfo, 1);
	ArrayArg requests;
	in.request_null = nullptr;
	in.requests = nullptr;
	if (per_key_array_arg(fcinfo, 2, "requests", JSONBOID, &keys, &requests))
	{
		in.request_null = requests.isnull;
		in.requests = requests.value;
	}
	ArrayArg fingerprints;
	in.has_fingerprint = nullptr;
	in.fingerprints = nullptr;
	if (per_key_array_arg(fcinfo, 3, "fingerprints", BYTEAOID, &keys, &fingerprints))
	{
		bool *has = (bool *) palloc(sizeof(bool) * Max(keys.n, 1));
		for (int i = 0; i < keys.n; i++)
		{
			has[i] = !fingerprints.isnull[i];
			if (!has[i])
				continue;
			bytea *given = DatumGetByteaPP(fingerprints.value[i]);
			fingerprints.value[i] = PointerGetDatum(given);
			int len = VARSIZE_ANY_EXHDR(given);
			if (len < 1 || len > max_fingerprint_bytes)
				ereport(ERROR, (errhidestmt(true), errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				                errmsg("element %d of argument \"fingerprints\" must be 1 to %d bytes long",
				                       fingerprints.lower + i, max_fingerprint_bytes),
				                errdetail("It is %d bytes long.", len)));
		}
		in.has_fingerprint = has;
		in.fingerprints = fingerprints.value;
	}
	in.ttl = duration_arg(fcinfo, 4, "ttl");
	in.lease = duration_arg(fcinfo, 5, "lease");
	in.wait = wait_arg(fcinfo, 6);
	// A database still at 1.3 calls this library with 1.3's seven arguments.
	in.applied = false;
	if (PG_NARGS() > 7)
	{
		reject_null(fcinfo, 7, "applied");
		in.applied = PG_GETARG_BOOL(7);
	}
	in.nkeys = keys.n;
	in.keys = keys.value;
	in.position = position;

	InitMaterializedSRF(fcinfo, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	if (rsinfo->setDesc->natts != claim_batch_columns)
		elog(ERROR, "idempotency: idem_claim_batch must return %d columns", claim_batch_columns);
	if (keys.n == 0)
		return (Datum) 0;
	BatchResult result;
	result.rsinfo = rsinfo;
	result.keys = keys.value;
	outcome_labels(TupleDescAttr(rsinfo->setDesc, 1)->atttypid, result.outcome_label);
	claim_batch(&in, emit_claim_row, &result);
	return (Datum) 0;
}

// idem_complete_batch(keys, scope, attempts, responses, response_code, ttl)
IDEM_SQL_FUNCTION(idem_complete_batch)
{
	ArrayArg keys;
	BatchFinishInput in;
	int *position;
	keys_arg(fcinfo, 0, &keys, &position);
	in.scope = scope_arg(fcinfo, 1);
	ArrayArg attempts;
	in.has_attempt = nullptr;
	in.attempts = nullptr;
	if (per_key_array_arg(fcinfo, 2, "attempts", INT4OID, &keys, &attempts))
	{
		bool *has = (bool *) palloc(sizeof(bool) * Max(keys.n, 1));
		int32 *values = (int32 *) palloc(sizeof(int32) * Max(keys.n, 1));
		for (int i = 0; i < keys.n; i++)
		{
			has[i] = !attempts.isnull[i];
			values[i] = has[i] ? DatumGetInt32(attempts.value[i]) : 0;
		}
		in.has_attempt = has;
		in.attempts = values;
	}
	ArrayArg responses;
	in.response_null = nullptr;
	in.responses = nullptr;
	if (per_key_array_arg(fcinfo, 3, "responses", JSONBOID, &keys, &responses))
	{
		in.response_null = responses.isnull;
		in.responses = responses.value;
	}
	reject_null(fcinfo, 4, "response_code");
	in.response_code = PG_GETARG_INT32(4);
	in.ttl = duration_arg(fcinfo, 5, "ttl");
	in.nkeys = keys.n;
	in.keys = keys.value;
	in.position = position;
	if (keys.n == 0)
		PG_RETURN_INT64(0);
	PG_RETURN_INT64(finish_batch(&in));
}
