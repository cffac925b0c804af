#include "common/fingerprint.hpp"

extern "C" {
#include "common/cryptohash.h"
#include "common/sha2.h"
}

namespace idem {

static void
hash_update(pg_cryptohash_ctx *ctx, const void *data, size_t len)
{
	if (pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "idempotency: could not compute the request fingerprint: %s",
		     pg_cryptohash_error(ctx));
}

bytea *
request_fingerprint(text *scope, Jsonb *request)
{
	// jsonb's text form is canonical: key order, duplicates and white space are normalised.
	char *canonical = JsonbToCString(nullptr, &request->root, VARSIZE(request));
	static const char separator = '\0';

	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	if (ctx == nullptr || pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "idempotency: could not start the request fingerprint");
	hash_update(ctx, VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope));
	hash_update(ctx, &separator, 1);
	hash_update(ctx, canonical, strlen(canonical));

	bytea *digest = (bytea *) palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	if (pg_cryptohash_final(ctx, (uint8 *) VARDATA(digest), PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "idempotency: could not finish the request fingerprint: %s",
		     pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	pfree(canonical);
	return digest;
}

} // namespace idem
