#include "common/fingerprint.hpp"

#include "common/sha256.hpp"

namespace idem {

// jsonb's text form is canonical: key order, duplicates and white space are normalised.
static char *
canonical_text(Jsonb *request)
{
	return JsonbToCString(nullptr, &request->root, VARSIZE(request));
}

static bytea *
hash_text(text *scope, const char *canonical)
{
	static const char separator = '\0';

	Sha256 hash;
	sha256_init(&hash);
	sha256_update(&hash, VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope));
	sha256_update(&hash, &separator, 1);
	sha256_update(&hash, canonical, strlen(canonical));

	bytea *digest = (bytea *) palloc(VARHDRSZ + sha256_digest_bytes);
	SET_VARSIZE(digest, VARHDRSZ + sha256_digest_bytes);
	sha256_final(&hash, (uint8_t *) VARDATA(digest));
	return digest;
}

static Numeric
trimmed(Numeric n)
{
	return DatumGetNumeric(DirectFunctionCall1(numeric_trim_scale, NumericGetDatum(n)));
}

static bool
is_number(JsonbIteratorToken token, const JsonbValue *v)
{
	return (token == WJB_VALUE || token == WJB_ELEM) && v->type == jbvNumeric;
}

// Whether some number in the canonical text has trailing fraction zeros. numeric_out writes a
// number's display scale in full and never an exponent, so a number differs from its trimmed form
// exactly when its text has a fraction ending in '0'. Reading the text that is hashed anyway costs
// a claim less than walking the jsonb and trimming every number.
static bool
has_untrimmed_number(const char *canonical)
{
	bool in_string = false;
	bool in_fraction = false;
	char last = '\0';
	for (const char *p = canonical;; p++)
	{
		char ch = *p;
		if (in_string)
		{
			if (ch == '\\')
				p++; // escape_json escapes one character at a time: skip it
			else if (ch == '"')
				in_string = false;
			continue;
		}
		if (in_fraction && (ch < '0' || ch > '9'))
		{
			if (last == '0')
				return true;
			in_fraction = false;
		}
		if (ch == '\0')
			return false;
		if (ch == '"')
			in_string = true;
		else if (ch == '.')
			in_fraction = true;
		last = ch;
	}
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
	char *canonical = canonical_text(request);
	if (has_untrimmed_number(canonical))
	{
		pfree(canonical);
		canonical = canonical_text(with_trimmed_numbers(request));
	}
	bytea *digest = hash_text(scope, canonical);
	pfree(canonical);
	return digest;
}

bytea *
request_fingerprint_1_1(text *scope, Jsonb *request)
{
	char *canonical = canonical_text(request);
	bytea *digest = hash_text(scope, canonical);
	pfree(canonical);
	return digest;
}

} // namespace idem
