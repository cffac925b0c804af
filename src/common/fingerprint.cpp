#include "common/fingerprint.hpp"

#include "common/sha256.hpp"

namespace idem {

static bytea *
hash_text(text *scope, Jsonb *request)
{
	// jsonb's text form is canonical: key order, duplicates and white space are normalised.
	char *canonical = JsonbToCString(nullptr, &request->root, VARSIZE(request));
	static const char separator = '\0';

	Sha256 hash;
	sha256_init(&hash);
	sha256_update(&hash, VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope));
	sha256_update(&hash, &separator, 1);
	sha256_update(&hash, canonical, strlen(canonical));

	bytea *digest = (bytea *) palloc(VARHDRSZ + sha256_digest_bytes);
	SET_VARSIZE(digest, VARHDRSZ + sha256_digest_bytes);
	sha256_final(&hash, (uint8_t *) VARDATA(digest));
	pfree(canonical);
	return digest;
}

static Numeric
trimmed(Numeric n)
{
	return DatumGetNumeric(DirectFunctionCall1(numeric_trim_scale, NumericGetDatum(n)));
}

static bool
same_numeric_bytes(Numeric a, Numeric b)
{
	return VARSIZE(a) == VARSIZE(b) && memcmp(a, b, VARSIZE(a)) == 0;
}

static bool
is_number(JsonbIteratorToken token, const JsonbValue *v)
{
	return (token == WJB_VALUE || token == WJB_ELEM) && v->type == jbvNumeric;
}

// Whether some number of the jsonb has trailing fraction zeros. Most requests have none, and
// are hashed as they are.
static bool
has_untrimmed_number(Jsonb *request)
{
	JsonbIterator *it = JsonbIteratorInit(&request->root);
	JsonbValue v;
	JsonbIteratorToken token;
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (is_number(token, &v) && !same_numeric_bytes(v.val.numeric, trimmed(v.val.numeric)))
			return true;
	}
	return false;
}

// The jsonb with every number trimmed of trailing fraction zeros.
static Jsonb *
with_trimmed_numbers(Jsonb *request)
{
	JsonbParseState *state = nullptr;
	JsonbValue *result = nullptr;
	JsonbIterator *it = JsonbIteratorInit(&request->root);
	JsonbValue v;
	JsonbIteratorToken token;
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (is_number(token, &v))
			v.val.numeric = trimmed(v.val.numeric);
		// Values go with their token; of the container tokens only a scalar's pseudo-array
		// carries one (its rawScalar flag).
		bool with_value = token == WJB_KEY || token == WJB_VALUE || token == WJB_ELEM ||
		                  (token == WJB_BEGIN_ARRAY && v.val.array.rawScalar);
		result = pushJsonbValue(&state, token, with_value ? &v : nullptr);
	}
	return JsonbValueToJsonb(result);
}

bytea *
request_fingerprint(text *scope, Jsonb *request)
{
	if (!has_untrimmed_number(request))
		return hash_text(scope, request);
	return hash_text(scope, with_trimmed_numbers(request));
}

bytea *
request_fingerprint_1_1(text *scope, Jsonb *request)
{
	return hash_text(scope, request);
}

} // namespace idem
