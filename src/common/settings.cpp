#include "common/settings.hpp"

#include "common/pg.hpp"

#include <climits>

namespace idem {

int setting_default_ttl_s = 24 * 60 * 60;
int setting_default_lease_ms = 60 * 1000;
int setting_max_key_length = 255;
int setting_reaper_batch_size = 1000;

// A primary-key entry must fit a btree page (about 2700 bytes) next to a 255-byte scope.
static constexpr int max_key_length_limit = 2000;

void
define_settings()
{
	DefineCustomIntVariable("idempotency.default_ttl",
	                        "How long a key is kept when idem_claim is given no ttl.",
	                        "After this the key may be reaped.", &setting_default_ttl_s,
	                        setting_default_ttl_s, 1, INT_MAX, PGC_USERSET, GUC_UNIT_S, nullptr,
	                        nullptr, nullptr);
	DefineCustomIntVariable("idempotency.default_lease",
	                        "How long a claim is owned when idem_claim is given no lease.",
	                        "After this a pending key may be taken over by another claim.",
	                        &setting_default_lease_ms, setting_default_lease_ms, 1, INT_MAX,
	                        PGC_USERSET, GUC_UNIT_MS, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("idempotency.max_key_length",
	                        "Longest accepted idempotency key, in characters.", nullptr,
	                        &setting_max_key_length, setting_max_key_length, 1,
	                        max_key_length_limit, PGC_SUSET, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("idempotency.reaper_batch_size",
	                        "Most expired keys deleted per batch (and by idem_reap by default).",
	                        nullptr, &setting_reaper_batch_size, setting_reaper_batch_size, 1,
	                        1000000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	MarkGUCPrefixReserved("idempotency");
}

} // namespace idem
