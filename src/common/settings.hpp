// The extension's settings (SPEC §6), defined by _PG_init.
#pragma once

namespace idem {

extern int setting_default_ttl_s;     // idempotency.default_ttl, seconds
extern int setting_default_lease_ms;  // idempotency.default_lease, milliseconds
extern int setting_max_key_length;    // idempotency.max_key_length, characters
extern int setting_reaper_batch_size; // idempotency.reaper_batch_size, rows

void define_settings();

} // namespace idem
