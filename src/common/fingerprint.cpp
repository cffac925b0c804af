#include "common/fingerprint.hpp"

#include "common/sha256.hpp"

namespace idem {

// The canonical text is jsonb's text form (JsonbToCString: key order, duplicates and white space
// are normalised), fed to the hash piece by piece as it is written, with no text built: a claim
// hashes it on every call, a replay included.

// A string as escape_json writes it: the runs that need no escape go to the hash whole.
static void
put_string(Sha256 *hash, const char *s, size_t len)
{
	sha256_update(hash, "\"", 1);
	const char *run = s;
	const char *end = s + len;
	for (const char *p = s; p < end; p++)
	{
		unsigned char ch = (unsigned char) *p;
		const char *escape;
		char unicode[7];
		switch (ch)
		{
			case '\b': escape = "\\b"; break;
			case '\f': escape = "\\f"; break;
			case '\n': escape = "\\n"; break;
			case '\r': escape = "\\r"; break;
			case '\t': escape = "\\t"; break;
			case '"': escape = "\\\""; break;
			case '\\': escape = "\\\\"; break;
			default:
				if (ch >= ' ')
					continue;
				snprintf(unicode, sizeof(unicode), "\\u%04x", ch);
				escape = unicode;
				break;
		}
		sha256_update(hash, run, p - run);
		sha256_update(hash, escape, strlen(escape));
		run = p + 1;
	}
	sha256_update(hash, run, end - run);
	sha256_update(hash, "\"", 1);
}

// Whether a number's text (numeric_out's: the whole display scale, never an exponent) has
// trailing fraction zeros, i.e. differs from its trimmed form.
static bool
is_untrimmed(const char *number)
{
	size_t len = strlen(number);
	return len > 0 && number[len - 1] == '0' && memchr(number, '.', len) != nullptr;
}

static void
put_number(Sha256 *hash, Numeric n, bool trim_numbers)
{
	char *text = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(n)));
	if (trim_numbers && is_untrimmed(text))
	{
		pfree(text);
		Datum trimmed = DirectFunctionCall1(numeric_trim_scale, NumericGetDatum(n));
		text = DatumGetCString(DirectFunctionCall1(numeric_out, trimmed));
	}
	sha256_update(hash, text, strlen(text));
	pfree(text);
}

static void
put_scalar(Sha256 *hash, const JsonbValue *v, bool trim_numbers)
{
	switch (v->type)
	{
		case jbvNull:
			sha256_update(hash, "null", 4);
			break;
		case jbvString:
			put_string(hash, v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			put_number(hash, v->val.numeric, trim_numbers);
			break;
		case jbvBool:
			if (v->val.boolean)
				sha256_update(hash, "true", 4);
			else
				sha256_update(hash, "false", 5);
			break;
		default:
			elog(ERROR, "idempotency: unexpected jsonb value type %d in a request", (int) v->type);
	}
}

// JsonbToCString's text without indentation: ", " between items, ": " after a key, a scalar at
// the top level without its pseudo-array's brackets.
static void
put_canonical(Sha256 *hash, Jsonb *request, bool trim_numbers)
{
	JsonbIterator *it = JsonbIteratorInit(&request->root);
	JsonbValue v;
	JsonbIteratorToken token;
	bool first = true; // nothing yet in the current container (or a key's value comes next)
	bool raw_scalar = false;
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (token)
		{
			case WJB_BEGIN_ARRAY:
				if (!first)
					sha256_update(hash, ", ", 2);
				if (v.val.array.rawScalar)
					raw_scalar = true;
				else
					sha256_update(hash, "[", 1);
				first = true;
				break;
			case WJB_BEGIN_OBJECT:
				if (!first)
					sha256_update(hash, ", ", 2);
				sha256_update(hash, "{", 1);
				first = true;
				break;
			case WJB_KEY:
				if (!first)
					sha256_update(hash, ", ", 2);
				put_scalar(hash, &v, trim_numbers);
				sha256_update(hash, ": ", 2);
				first = true;
				break;
			case WJB_VALUE:
				put_scalar(hash, &v, trim_numbers);
				first = false;
				break;
			case WJB_ELEM:
				if (!first)
					sha256_update(hash, ", ", 2);
				put_scalar(hash, &v, trim_numbers);
				first = false;
				break;
			case WJB_END_ARRAY:
				if (!raw_scalar)
					sha256_update(hash, "]", 1);
				first = false;
				break;
			case WJB_END_OBJECT:
				sha256_update(hash, "}", 1);
				first = false;
				break;
			default:
				elog(ERROR, "idempotency: unexpected jsonb iterator token %d in a request", (int) token);
		}
	}
}

// The hash is abandoned here: the next sha256_init starts afresh.
static void
report_hash_failure(const Sha256 *hash)
{
	if (hash->failure == Sha256Failure::out_of_memory)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory"),
		                errdetail("OpenSSL could not compute the request fingerprint: %s failed: %s.",
		                          hash->failed_call, hash->reason)));
	ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
	                errmsg("idempotency: OpenSSL could not compute the request fingerprint"),
	                errdetail("%s failed: %s.", hash->failed_call, hash->reason)));
}

static bytea *
fingerprint(text *scope, Jsonb *request, bool trim_numbers)
{
	static const char separator = '\0';

	Sha256 hash;
	if (!sha256_init(&hash))
		report_hash_failure(&hash);
	sha256_update(&hash, VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope));
	sha256_update(&hash, &separator, 1);
	put_canonical(&hash, request, trim_numbers);

	bytea *digest = (bytea *) palloc(VARHDRSZ + sha256_digest_bytes);
	SET_VARSIZE(digest, VARHDRSZ + sha256_digest_bytes);
	if (!sha256_final(&hash, (uint8_t *) VARDATA(digest)))
		report_hash_failure(&hash);
	return digest;
}

bytea *
request_fingerprint(text *scope, Jsonb *request)
{
	return fingerprint(scope, request, true);
}

bytea *
request_fingerprint_1_1(text *scope, Jsonb *request)
{
	return fingerprint(scope, request, false);
}

} // namespace idem
