#include "common/fingerprint.hpp"

#include "common/sha256.hpp"

namespace idem {

bytea *
request_fingerprint(text *scope, Jsonb *request)
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

} // namespace idem
