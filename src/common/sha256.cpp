#include "common/sha256.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace idem {

alignas(16) static const uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t
rotr(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void
compress(uint32_t state[8], const uint8_t *p)
{
	uint32_t w[64];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t) p[4 * i] << 24 | (uint32_t) p[4 * i + 1] << 16 | (uint32_t) p[4 * i + 2] << 8 |
		       (uint32_t) p[4 * i + 3];
	for (int i = 16; i < 64; i++)
	{
		uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
	uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
	for (int i = 0; i < 64; i++)
	{
		uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
		              round_constants[i] + w[i];
		uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		h = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	state[0] += a;
	state[1] += b;
	state[2] += c;
	state[3] += d;
	state[4] += e;
	state[5] += f;
	state[6] += g;
	state[7] += h;
}

void
sha256_blocks_portable(uint32_t state[8], const uint8_t *blocks, size_t count)
{
	for (; count > 0; count--, blocks += 64)
		compress(state, blocks);
}

#if defined(__x86_64__)

// SHA-NI: sha256rnds2 does two rounds on the working variables held as (A, B, E, F) and
// (C, D, G, H) vectors (highest lane first); sha256msg1 and sha256msg2 extend the schedule four
// words at a time. Compiled for those instructions only here, and called only where the CPU has
// them.
__attribute__((target("sha,sse4.1,ssse3"))) static void
sha256_blocks_shani(uint32_t state[8], const uint8_t *blocks, size_t count)
{
	// each 32-bit word of a block is big-endian
	const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);

	// state[0..7] = A..H into ABEF = lanes (F, E, B, A) and CDGH = lanes (H, G, D, C)
	__m128i badc = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &state[0]), 0xB1);
	__m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *) &state[4]), 0x1B);
	__m128i abef = _mm_alignr_epi8(badc, hgfe, 8);
	__m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);

	for (; count > 0; count--, blocks += 64)
	{
		const __m128i abef_before = abef, cdgh_before = cdgh;
		__m128i w[4]; // words 4j .. 4j+3 of the schedule, j mod 4
		// unrolled, the four vectors stay in registers
#pragma GCC unroll 16
		for (int j = 0; j < 16; j++)
		{
			__m128i words;
			if (j < 4)
				words = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) (blocks + 16 * j)), byteswap);
			else
			{
				// W[t-16] + σ0(W[t-15]), + W[t-7], then + σ1(W[t-2]) for t = 4j .. 4j+3
				__m128i partial = _mm_sha256msg1_epu32(w[j & 3], w[(j + 1) & 3]);
				partial = _mm_add_epi32(partial, _mm_alignr_epi8(w[(j + 3) & 3], w[(j + 2) & 3], 4));
				words = _mm_sha256msg2_epu32(partial, w[(j + 3) & 3]);
			}
			w[j & 3] = words;
			__m128i kw = _mm_add_epi32(words, _mm_load_si128((const __m128i *) &round_constants[4 * j]));
			cdgh = _mm_sha256rnds2_epu32(cdgh, abef, kw);
			abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(kw, 0x0E));
		}
		abef = _mm_add_epi32(abef, abef_before);
		cdgh = _mm_add_epi32(cdgh, cdgh_before);
	}

	// back to A..H
	__m128i abef_lanes = _mm_shuffle_epi32(abef, 0x1B); // (A, B, E, F) from the lowest lane
	__m128i ghcd = _mm_shuffle_epi32(cdgh, 0xB1);        // (G, H, C, D)
	_mm_storeu_si128((__m128i *) &state[0], _mm_blend_epi16(abef_lanes, ghcd, 0xF0));
	_mm_storeu_si128((__m128i *) &state[4], _mm_alignr_epi8(ghcd, abef_lanes, 8));
}

Sha256Blocks
sha256_blocks_hardware()
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("ssse3"))
		return sha256_blocks_shani;
	return nullptr;
}

#else

Sha256Blocks
sha256_blocks_hardware()
{
	return nullptr;
}

#endif

static Sha256Blocks
choose_blocks()
{
	Sha256Blocks hardware = sha256_blocks_hardware();
	return hardware ? hardware : sha256_blocks_portable;
}

static const Sha256Blocks compress_blocks = choose_blocks();

void
sha256_init(Sha256 *h)
{
	static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(h->state, initial, sizeof(initial));
	h->length = 0;
	h->used = 0;
}

void
sha256_update_blocks(Sha256 *h, const void *data, size_t len)
{
	const uint8_t *p = static_cast<const uint8_t *>(data);
	h->length += len;
	if (h->used > 0)
	{
		size_t take = len < 64 - h->used ? len : 64 - h->used;
		memcpy(h->block + h->used, p, take);
		h->used += take;
		p += take;
		len -= take;
		if (h->used < 64)
			return;
		compress_blocks(h->state, h->block, 1);
		h->used = 0;
	}
	if (len >= 64)
	{
		compress_blocks(h->state, p, len / 64);
		p += len - len % 64;
		len %= 64;
	}
	memcpy(h->block, p, len);
	h->used = len;
}

void
sha256_final(Sha256 *h, uint8_t digest[sha256_digest_bytes])
{
	uint64_t bits = h->length * 8;
	h->block[h->used++] = 0x80;
	if (h->used > 56)
	{
		memset(h->block + h->used, 0, 64 - h->used);
		compress_blocks(h->state, h->block, 1);
		h->used = 0;
	}
	memset(h->block + h->used, 0, 56 - h->used);
	for (int i = 0; i < 8; i++)
		h->block[56 + i] = (uint8_t) (bits >> (56 - 8 * i));
	compress_blocks(h->state, h->block, 1);
	for (int i = 0; i < 8; i++)
	{
		digest[4 * i] = (uint8_t) (h->state[i] >> 24);
		digest[4 * i + 1] = (uint8_t) (h->state[i] >> 16);
		digest[4 * i + 2] = (uint8_t) (h->state[i] >> 8);
		digest[4 * i + 3] = (uint8_t) h->state[i];
	}
}

} // namespace idem
