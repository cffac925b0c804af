// SHA-256 (FIPS 180-4), computed in-process: a request fingerprint is a hash of about a hundred
// bytes per claim, and OpenSSL's EVP set-up per call (pg_cryptohash) cost more than the hash.
// Blocks are compressed with the CPU's SHA extensions where it has them (x86-64 SHA-NI), else by
// portable code; both give the same digest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace idem {

constexpr size_t sha256_digest_bytes = 32;

// Plain data (no destructor): safe on paths that may ereport.
struct Sha256
{
	uint32_t state[8];
	uint64_t length; // bytes hashed so far
	uint8_t block[64];
	size_t used; // bytes of `block` filled
};

void sha256_init(Sha256 *h);
void sha256_final(Sha256 *h, uint8_t digest[sha256_digest_bytes]);

// sha256_update's general case (any input; called for input that completes the buffered block).
void sha256_update_blocks(Sha256 *h, const void *data, size_t len);

// Inline for the short pieces (a quote, a key, ", ") that a canonical text is fed in.
inline void
sha256_update(Sha256 *h, const void *data, size_t len)
{
	if (len < sizeof(h->block) - h->used)
	{
		memcpy(h->block + h->used, data, len);
		h->used += len;
		h->length += len;
		return;
	}
	sha256_update_blocks(h, data, len);
}

// The compression function: `count` consecutive 64-byte blocks into `state`. sha256_update and
// sha256_final use the hardware one when the CPU has it (chosen once, when the library is
// loaded), else the portable one; each is exposed so that its test can check it against a
// reference on a machine that has both.
using Sha256Blocks = void (*)(uint32_t state[8], const uint8_t *blocks, size_t count);
void sha256_blocks_portable(uint32_t state[8], const uint8_t *blocks, size_t count);
// The SHA extensions' version, or nullptr where the CPU (or the architecture) lacks them.
Sha256Blocks sha256_blocks_hardware();

} // namespace idem
