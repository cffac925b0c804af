// SHA-256 of a request fingerprint, computed by OpenSSL's libcrypto (EVP): docs/design.md,
// "Fingerprint", says why and how.
//
// A process hashes one message at a time, in one EVP context of its own: created at the first
// sha256_init and re-initialised by every sha256_init, so that a hash abandoned half-way (an
// ereport between init and final) leaves nothing that the next one sees. No PostgreSQL in here:
// a failure is recorded in the Sha256 (the later calls on it then do nothing) and sha256_init or
// sha256_final returns false for the caller to report it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace idem {

constexpr size_t sha256_digest_bytes = 32;

enum class Sha256Failure : uint8_t
{
	none,
	out_of_memory, // OpenSSL could not allocate
	openssl,       // another OpenSSL error
};

// Plain data (no destructor): safe on paths that may ereport.
struct Sha256
{
	// The message's pieces are gathered here and reach EVP_DigestUpdate as whole blocks: a
	// canonical text is written in pieces of a few bytes ("\"", ", ", a key), and each EVP call
	// costs more than copying them.
	uint8_t buffer[128];
	size_t used; // bytes of `buffer` filled
	Sha256Failure failure;
	const char *failed_call; // the OpenSSL function that failed
	const char *reason;      // why, in OpenSSL's words where it gave some
};

// Starts a hash; false on failure.
bool sha256_init(Sha256 *h);

// sha256_update's general case: input that fills the buffer.
void sha256_update_buffered(Sha256 *h, const void *data, size_t len);

// Inline for the short pieces (a quote, a key, ", ") that a canonical text is fed in.
inline void
sha256_update(Sha256 *h, const void *data, size_t len)
{
	// (the first test tells the compiler that h->used + len cannot wrap)
	if (len < sizeof(h->buffer) && h->used + len < sizeof(h->buffer))
	{
		memcpy(h->buffer + h->used, data, len);
		h->used += len;
		return;
	}
	sha256_update_buffered(h, data, len);
}

// Ends the hash; false on failure (in this call or an earlier one on h).
bool sha256_final(Sha256 *h, uint8_t digest[sha256_digest_bytes]);

} // namespace idem
