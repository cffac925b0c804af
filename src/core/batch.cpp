// Batches (message consumers): idem_claim_batch and idem_complete_batch, each key by the rules of
// one claim or one completion, in the primary key's order.
#include "core/keystate.hpp"

#include "common/errors.hpp"
#include "core/path.hpp"
#include "stats/stats.hpp"

namespace idem {

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

// Which key of a batch an error is about (docs/contract.md §11): every error raised while a key is
// handled gets a CONTEXT line naming the key and its element of "keys"; an error about the key's
// own state also carries the key in its column-name field (psycopg's diag.column_name,
// node-postgres' err.column, PL/pgSQL's COLUMN_NAME), so that a consumer can set that message aside
// without parsing text. No field of PostgreSQL's errors is meant for a value; the column name is
// the one that errors of these functions never otherwise set.
struct BatchKeyContext
{
	ErrorContextCallback callback;
	const char *verb; // "claiming", "completing"
	Datum key;
	int position;
};

// The SQLSTATEs that say something about the one key being handled, rather than about the call,
// the transaction or the server.
static bool
about_key_state(int sqlstate)
{
	return sqlstate == ERRCODE_IDEM_KEY_MISMATCH || sqlstate == ERRCODE_IDEM_ATTEMPT_STALE ||
	       sqlstate == ERRCODE_IDEM_KEY_NOT_FOUND || sqlstate == ERRCODE_IDEM_KEY_NOT_PENDING ||
	       sqlstate == ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE;
}

static void
report_batch_key(void *arg)
{
	const BatchKeyContext *at = static_cast<const BatchKeyContext *>(arg);
	const char *key = key_text(at->key);
	errcontext("while %s idempotency key \"%s\", element %d of argument \"keys\"", at->verb, key, at->position);
	if (about_key_state(geterrcode()))
		err_generic_string(PG_DIAG_COLUMN_NAME, key);
}

// Pushed once per batch and pointed at each key in turn. palloc'd rather than on the stack: a C++
// exception would leave the entry on error_context_stack while the entry point reports it.
static BatchKeyContext *
batch_key_context_push(const char *verb)
{
	BatchKeyContext *at = (BatchKeyContext *) palloc(sizeof(BatchKeyContext));
	at->verb = verb;
	at->key = (Datum) 0;
	at->position = 0;
	at->callback.callback = report_batch_key;
	at->callback.arg = at;
	at->callback.previous = error_context_stack;
	error_context_stack = &at->callback;
	return at;
}

static void
batch_key_context_pop(BatchKeyContext *at)
{
	error_context_stack = at->callback.previous;
	pfree(at);
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
	KeyPath path;
	const Catalog *c = path_open(&path, Access::write, "idem_claim_batch()");
	bool *has_fingerprint = (bool *) palloc(sizeof(bool) * Max(in->nkeys, 1));
	Datum *fingerprint = (Datum *) palloc(sizeof(Datum) * Max(in->nkeys, 1));
	batch_fingerprints(c, in, has_fingerprint, fingerprint);
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
			                          in->position[Max(first, next)]),
			                err_generic_string(PG_DIAG_COLUMN_NAME, key_text(in->keys[next]))));
		}
	}

	path_batch_begin(&path);
	// Where each row was written, for the completion in this transaction; applied keys are
	// finished already.
	path_batch_claims_begin(&path, in->scope, in->nkeys, !in->applied);
	MemoryContext key_cxt = per_key_context();
	BatchKeyContext *at = batch_key_context_push("claiming");
	for (int s = 0; s < in->nkeys; s++)
	{
		if (s > 0 && same_key(&sorted[s - 1], &sorted[s]))
			continue;
		int i = sorted[s].index;
		at->key = in->keys[i];
		at->position = in->position[i];
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
		path_batch_claim(&path, &key_in, &waiter, &out);
		waiter_end(&waiter);
		emit(arg, i, &out);
		path_batch_next(&path);
		MemoryContextSwitchTo(caller_cxt);
		MemoryContextReset(key_cxt);
	}
	batch_key_context_pop(at);
	MemoryContextDelete(key_cxt);
	path_close(&path);
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
			                          in->position[Max(first, next)]),
			                err_generic_string(PG_DIAG_COLUMN_NAME, key_text(in->keys[next]))));
	}

	KeyPath path;
	const Catalog *c = path_open(&path, Access::write, "idem_complete_batch()");
	path_batch_begin(&path);
	MemoryContext key_cxt = per_key_context();
	BatchKeyContext *at = batch_key_context_push("completing");
	for (int s = 0; s < in->nkeys; s++)
	{
		int i = sorted[s].index;
		at->key = in->keys[i];
		at->position = in->position[i];
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
			finish_row(c, &key_in, row);
		};
		(void) path_update(&path, key_in.scope, key_in.key, change);
		stats_finished(Counter::completes, key_in.scope, claimed_at);
		wake_at_commit(key_in.scope, key_in.key);
		path_batch_next(&path);
		MemoryContextSwitchTo(caller_cxt);
		MemoryContextReset(key_cxt);
	}
	batch_key_context_pop(at);
	MemoryContextDelete(key_cxt);
	path_close(&path);
	pfree(sorted);
	return in->nkeys;
}

} // namespace idem
