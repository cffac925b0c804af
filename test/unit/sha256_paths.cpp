// Prints SHA-256 digests of generated messages for test/t/026_sha256_paths.pl to check against
// Perl's Digest::SHA: through each compression function this CPU runs (portable, and the SHA
// extensions' where the CPU has them), and through sha256_update/sha256_final fed in uneven
// pieces. Message of length n: byte i is (i * 131 + n) mod 256.
//
//   <path> <n> <hex digest>     path: portable | hardware | api
#include "common/sha256.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

using namespace idem;

static std::vector<uint8_t>
message(size_t n)
{
	std::vector<uint8_t> m(n);
	for (size_t i = 0; i < n; i++)
		m[i] = (uint8_t) (i * 131 + n);
	return m;
}

static void
print(const char *path, size_t n, const uint8_t digest[sha256_digest_bytes])
{
	printf("%s %zu ", path, n);
	for (size_t i = 0; i < sha256_digest_bytes; i++)
		printf("%02x", digest[i]);
	printf("\n");
}

// FIPS 180-4 padding done here, so that the compression function alone is under test.
static void
digest_with(Sha256Blocks blocks, const std::vector<uint8_t> &m, uint8_t digest[sha256_digest_bytes])
{
	std::vector<uint8_t> padded(m);
	padded.push_back(0x80);
	while (padded.size() % 64 != 56)
		padded.push_back(0);
	uint64_t bits = (uint64_t) m.size() * 8;
	for (int i = 7; i >= 0; i--)
		padded.push_back((uint8_t) (bits >> (8 * i)));
	Sha256 h;
	sha256_init(&h);
	blocks(h.state, padded.data(), padded.size() / 64);
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 4; j++)
			digest[4 * i + j] = (uint8_t) (h.state[i] >> (24 - 8 * j));
}

int
main()
{
	std::vector<size_t> lengths;
	for (size_t n = 0; n <= 300; n++)
		lengths.push_back(n);
	lengths.push_back(1000);
	lengths.push_back(65536 + 3);

	Sha256Blocks hardware = sha256_blocks_hardware();
	uint8_t digest[sha256_digest_bytes];
	for (size_t n : lengths)
	{
		std::vector<uint8_t> m = message(n);
		digest_with(sha256_blocks_portable, m, digest);
		print("portable", n, digest);
		if (hardware)
		{
			digest_with(hardware, m, digest);
			print("hardware", n, digest);
		}
		// pieces of 1 to 70 bytes, so that every way of filling and crossing the buffered block
		// is taken across the lengths
		Sha256 h;
		sha256_init(&h);
		size_t piece = 1 + n % 70;
		for (size_t at = 0; at < n; at += piece)
			sha256_update(&h, m.data() + at, n - at < piece ? n - at : piece);
		sha256_final(&h, digest);
		print("api", n, digest);
	}
	return 0;
}
