#include "common/settings.hpp"

#include "common/pg.hpp"

#include <climits>

namespace idem {

int setting_default_ttl_s = 24 * 60 * 60;
int setting_default_lease_ms = 60 * 1000;
int setting_max_key_length = 255;
int setting_reaper_batch_size = 1000;
bool setting_reaper_enabled = true;
int setting_reaper_naptime_s = 60;
char *setting_reaper_databases = nullptr;
int setting_reaper_log_level = LOG;
bool setting_track = true;
int setting_track_scopes = 1000;

static const struct config_enum_entry reaper_log_levels[] = {
	{"debug5", DEBUG5, false}, {"debug4", DEBUG4, false}, {"debug3", DEBUG3, false},
	{"debug2", DEBUG2, false}, {"debug1", DEBUG1, false}, {"debug", DEBUG2, true},
	{"info", INFO, false},     {"notice", NOTICE, false}, {"warning", WARNING, false},
	{"log", LOG, false},       {nullptr, 0, false}};

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
	DefineCustomBoolVariable("idempotency.reaper_enabled",
	                         "Whether the background reaper deletes expired keys.",
	                         "Needs shared_preload_libraries = 'idempotency'.", &setting_reaper_enabled,
	                         setting_reaper_enabled, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	DefineCustomIntVariable("idempotency.reaper_naptime",
	                        "Time the background reaper sleeps between passes over a database.",
	                        nullptr, &setting_reaper_naptime_s, setting_reaper_naptime_s, 1,
	                        INT_MAX / 1000, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
	DefineCustomStringVariable("idempotency.reaper_databases",
	                           "Databases the background reaper serves (comma-separated).",
	                           "Empty: every database that has the extension.",
	                           &setting_reaper_databases, "", PGC_SIGHUP, GUC_LIST_INPUT, nullptr,
	                           nullptr, nullptr);
	DefineCustomEnumVariable("idempotency.reaper_log_level",
	                         "Message level of the background reaper's report of a pass that deleted keys.",
	                         "Passes that delete nothing are reported at DEBUG1.",
	                         &setting_reaper_log_level, setting_reaper_log_level, reaper_log_levels,
	                         PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
	// superuser: a role must not be able to hide its own claims from the statistics
	DefineCustomBoolVariable("idempotency.track",
	                         "Whether per-scope statistics (idem_scope_stats) are collected.",
	                         "Needs shared_preload_libraries = 'idempotency'.", &setting_track,
	                         setting_track, PGC_SUSET, 0, nullptr, nullptr, nullptr);
	// Sizes shared memory, so exists only when preloaded (a later load could not define it).
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.track_scopes",
		                        "Most (database, scope) entries kept by idem_scope_stats.",
		                        "The least used entries are evicted beyond it.", &setting_track_scopes,
		                        setting_track_scopes, 10, 100000, PGC_POSTMASTER, 0, nullptr,
		                        nullptr, nullptr);
	MarkGUCPrefixReserved("idempotency");
}

} // namespace idem
