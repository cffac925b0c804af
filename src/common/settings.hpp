// The extension's settings (docs/contract.md §6), defined by _PG_init.
#pragma once

namespace idem {

extern int setting_default_ttl_s;     // idempotency.default_ttl, seconds
extern int setting_default_lease_ms;  // idempotency.default_lease, milliseconds
extern int setting_max_key_length;    // idempotency.max_key_length, characters
extern int setting_reaper_batch_size; // idempotency.reaper_batch_size, rows
extern bool setting_reaper_enabled;    // idempotency.reaper_enabled
extern int setting_reaper_naptime_s;  // idempotency.reaper_naptime, seconds
extern char *setting_reaper_databases; // idempotency.reaper_databases, '' = all
extern int setting_reaper_log_level;  // idempotency.reaper_log_level, an elevel
extern bool setting_track;             // idempotency.track: per-scope statistics
extern int setting_track_scopes;      // idempotency.track_scopes, entries

void define_settings();

} // namespace idem
