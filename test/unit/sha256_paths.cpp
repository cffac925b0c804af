// Drives src/common/sha256.cpp (OpenSSL's EVP behind a 128-byte buffer) for
// test/t/026_sha256_paths.pl, which checks every digest against Perl's Digest::SHA. A message of
// length n: byte i is (i * 131 + n) mod 256. Output, one line each:
//
//   digest <way> <n> <hex>     the message of n bytes fed in a way that takes some path through
//                              the buffer (see `ways`)
//   alloc <k> <failed> <kind> <call> <then> <n> <hex>
//                              in a fresh process whose k-th OpenSSL allocation fails: whether
//                              the first hash failed, how (none | out_of_memory | openssl) and in
//                              which call, whether the next hash succeeded and its digest
//   allocations <count>        how many allocations the first hash of a fresh process makes
#include "common/sha256.hpp"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace idem;

// OpenSSL's allocations, counted; the one numbered fail_at (from 1) fails.
static long allocations;
static long fail_at;

static void *
counting_malloc(size_t size, const char *, int)
{
	return ++allocations == fail_at ? nullptr : malloc(size);
}

static void *
counting_realloc(void *p, size_t size, const char *, int)
{
	return ++allocations == fail_at ? nullptr : realloc(p, size);
}

static void
plain_free(void *p, const char *, int)
{
	free(p);
}

static std::vector<uint8_t>
message(size_t n)
{
	std::vector<uint8_t> m(n);
	for (size_t i = 0; i < n; i++)
		m[i] = (uint8_t) (i * 131 + n);
	return m;
}

static void
print_hex(const uint8_t digest[sha256_digest_bytes])
{
	for (size_t i = 0; i < sha256_digest_bytes; i++)
		printf("%02x", digest[i]);
}

// The message in pieces of the given sizes, repeated until it is all fed.
static bool
hash_in_pieces(const std::vector<uint8_t> &m, const std::vector<size_t> &pieces,
               uint8_t digest[sha256_digest_bytes])
{
	Sha256 h;
	if (!sha256_init(&h))
		return false;
	size_t at = 0;
	for (size_t i = 0; at < m.size(); i = (i + 1) % pieces.size())
	{
		size_t len = m.size() - at < pieces[i] ? m.size() - at : pieces[i];
		sha256_update(&h, m.data() + at, len);
		at += len;
	}
	return sha256_final(&h, digest);
}

static const char *
failure_name(Sha256Failure failure)
{
	switch (failure)
	{
		case Sha256Failure::none: return "none";
		case Sha256Failure::out_of_memory: return "out_of_memory";
		case Sha256Failure::openssl: return "openssl";
	}
	return "?";
}

// In a child process (a fresh OpenSSL, as in a new backend): the k-th allocation fails during
// the first hash, then a second hash runs with nothing failing.
static void
first_hash_with_failing_allocation(long k)
{
	fflush(stdout);
	pid_t child = fork();
	if (child < 0)
	{
		perror("fork");
		exit(1);
	}
	if (child == 0)
	{
		std::vector<uint8_t> m = message(200);
		uint8_t digest[sha256_digest_bytes];
		fail_at = k;
		Sha256 h;
		bool failed = !sha256_init(&h);
		if (!failed)
		{
			sha256_update(&h, m.data(), m.size());
			failed = !sha256_final(&h, digest);
		}
		fail_at = 0;
		Sha256 next;
		bool then = sha256_init(&next);
		if (then)
		{
			sha256_update(&next, m.data(), m.size());
			then = sha256_final(&next, digest);
		}
		printf("alloc %ld %d %s %s %d %s %s %zu ", k, failed ? 1 : 0, failure_name(h.failure),
		       h.failed_call ? h.failed_call : "-", then ? 1 : 0, failure_name(next.failure),
		       next.failed_call ? next.failed_call : "-", m.size());
		print_hex(digest);
		printf("\n");
		fflush(stdout);
		_exit(0);
	}
	int status;
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		printf("alloc %ld crashed\n", k);
}

int
main()
{
	if (CRYPTO_set_mem_functions(counting_malloc, counting_realloc, plain_free) != 1)
	{
		fprintf(stderr, "CRYPTO_set_mem_functions failed: OpenSSL allocated before main\n");
		return 1;
	}

	// What a backend finds done before its first fingerprint: the postmaster has drawn random
	// bytes from OpenSSL (pg_strong_random), which set up OpenSSL's library context and default
	// provider. (An allocation failing inside that set-up crashes OpenSSL 3.0 itself.)
	unsigned char random_bytes[8];
	if (RAND_bytes(random_bytes, sizeof(random_bytes)) != 1)
		return 1;
	allocations = 0;

	// How many allocations the first hash of a process makes, counted in a child, then each of
	// them failed in turn.
	fflush(stdout);
	int pipe_fds[2];
	if (pipe(pipe_fds) != 0)
		return 1;
	pid_t child = fork();
	if (child == 0)
	{
		uint8_t digest[sha256_digest_bytes];
		bool ok = hash_in_pieces(message(200), {200}, digest);
		long count = ok ? allocations : -1;
		_exit(write(pipe_fds[1], &count, sizeof(count)) == sizeof(count) ? 0 : 1);
	}
	long first_hash_allocations = -1;
	int status;
	if (child < 0 || waitpid(child, &status, 0) != child ||
	    read(pipe_fds[0], &first_hash_allocations, sizeof(first_hash_allocations)) !=
	        sizeof(first_hash_allocations))
		return 1;
	printf("allocations %ld\n", first_hash_allocations);
	for (long k = 1; k <= first_hash_allocations; k++)
		first_hash_with_failing_allocation(k);

	std::vector<size_t> lengths;
	for (size_t n = 0; n <= 300; n++)
		lengths.push_back(n);
	lengths.push_back(1000);
	lengths.push_back(65536 + 3);

	// Ways to feed a message, each a list of piece sizes used in turn: whole; pieces at the
	// block edges (55, 56, 63, 64, 65) and the buffer's (127, 128, 129); uneven pieces that end at
	// every offset of the buffer; a short piece then a long one (the buffer partly filled when a
	// piece longer than it comes).
	struct Way
	{
		const char *name;
		std::vector<size_t> pieces;
	};
	const std::vector<Way> ways = {
	    {"whole", {SIZE_MAX}},
	    {"1", {1}},
	    {"55", {55}},
	    {"56", {56}},
	    {"63", {63}},
	    {"64", {64}},
	    {"65", {65}},
	    {"127", {127}},
	    {"128", {128}},
	    {"129", {129}},
	    {"uneven", {1, 2, 3, 5, 8, 13, 21, 34, 7, 11, 127, 129}},
	    {"short-long", {3, 300}},
	    {"short-blocks", {1, 64, 2, 128, 3, 192}},
	};

	uint8_t digest[sha256_digest_bytes];
	for (size_t n : lengths)
	{
		std::vector<uint8_t> m = message(n);
		for (const Way &way : ways)
		{
			if (!hash_in_pieces(m, way.pieces, digest))
				return 1;
			printf("digest %s %zu ", way.name, n);
			print_hex(digest);
			printf("\n");
		}
		// A hash abandoned half-way (as by an ereport between init and final: 200 bytes, so
		// that some reached OpenSSL) leaves nothing in the next one.
		Sha256 abandoned;
		if (!sha256_init(&abandoned))
			return 1;
		std::vector<uint8_t> other = message(200 + n % 64);
		sha256_update(&abandoned, other.data(), other.size());
		if (!hash_in_pieces(m, {7}, digest))
			return 1;
		printf("digest after-abandoned %zu ", n);
		print_hex(digest);
		printf("\n");
	}
	return 0;
}
