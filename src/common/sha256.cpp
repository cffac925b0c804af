#include "common/sha256.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>

namespace idem {

// Fetched once: an EVP_MD looked up per hash (as pg_cryptohash does) costs more than hashing a
// request. The context is reused for the same reason.
static EVP_MD *sha256_md;
static EVP_MD_CTX *sha256_ctx;

static bool
fail(Sha256 *h, const char *call, Sha256Failure failure, const char *reason)
{
	h->failure = failure;
	h->failed_call = call;
	h->reason = reason;
	return false;
}

static bool
fail_openssl(Sha256 *h, const char *call)
{
	// the last error queued is the failed call's own; the queue is left empty for whoever uses
	// OpenSSL next in this process (the server's SSL code)
	unsigned long error = ERR_peek_last_error();
	ERR_clear_error();
	const char *reason = error != 0 ? ERR_reason_error_string(error) : nullptr;
	return fail(h, call,
	            ERR_GET_REASON(error) == ERR_R_MALLOC_FAILURE ? Sha256Failure::out_of_memory
	                                                          : Sha256Failure::openssl,
	            reason != nullptr ? reason : "no error reported");
}

bool
sha256_init(Sha256 *h)
{
	h->used = 0;
	h->failure = Sha256Failure::none;
	h->failed_call = nullptr;
	h->reason = nullptr;
	if (sha256_md == nullptr && (sha256_md = EVP_MD_fetch(nullptr, "SHA256", nullptr)) == nullptr)
		return fail_openssl(h, "EVP_MD_fetch");
	if (sha256_ctx == nullptr && (sha256_ctx = EVP_MD_CTX_new()) == nullptr)
		return fail(h, "EVP_MD_CTX_new", Sha256Failure::out_of_memory, "allocation failed");
	// whatever an abandoned hash left in the context is dropped here
	if (EVP_DigestInit_ex2(sha256_ctx, sha256_md, nullptr) != 1)
		return fail_openssl(h, "EVP_DigestInit_ex2");
	return true;
}

static bool
digest_update(Sha256 *h, const void *data, size_t len)
{
	return EVP_DigestUpdate(sha256_ctx, data, len) == 1 || fail_openssl(h, "EVP_DigestUpdate");
}

void
sha256_update_buffered(Sha256 *h, const void *data, size_t len)
{
	if (h->failure != Sha256Failure::none)
		return;
	const uint8_t *p = static_cast<const uint8_t *>(data);
	size_t fill = sizeof(h->buffer) - h->used;
	memcpy(h->buffer + h->used, p, fill);
	p += fill;
	len -= fill;
	if (!digest_update(h, h->buffer, sizeof(h->buffer)))
		return;
	// whole blocks straight from the input: every update before sha256_final's is whole blocks,
	// which OpenSSL compresses where they are, never copying a partial one
	size_t blocks = len - len % 64;
	if (blocks > 0 && !digest_update(h, p, blocks))
		return;
	memcpy(h->buffer, p + blocks, len - blocks);
	h->used = len - blocks;
}

bool
sha256_final(Sha256 *h, uint8_t digest[sha256_digest_bytes])
{
	if (h->failure != Sha256Failure::none)
		return false;
	if (h->used > 0 && !digest_update(h, h->buffer, h->used))
		return false;
	unsigned int length = 0;
	if (EVP_DigestFinal_ex(sha256_ctx, digest, &length) != 1)
		return fail_openssl(h, "EVP_DigestFinal_ex");
	if (length != sha256_digest_bytes)
		return fail(h, "EVP_DigestFinal_ex", Sha256Failure::openssl, "a digest of the wrong length");
	return true;
}

} // namespace idem
