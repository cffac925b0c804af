// SHA-256 (FIPS 180-4), computed in-process: a request fingerprint is a hash of about a hundred
// bytes per claim, and OpenSSL's EVP set-up per call (pg_cryptohash) cost more than the hash.
#pragma once

#include <cstddef>
#include <cstdint>

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
void sha256_update(Sha256 *h, const void *data, size_t len);
void sha256_final(Sha256 *h, uint8_t digest[sha256_digest_bytes]);

} // namespace idem
