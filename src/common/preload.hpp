// Whether the library was preloaded, and saying so when it matters (docs/operations.md,
// "Without shared_preload_libraries").
#pragma once

namespace idem {

// Called once by _PG_init: remembers how the library was loaded and, when CREATE or ALTER
// EXTENSION loads it without preloading, warns that the reaper, statistics and waking are missing.
void preload_note_loading();

// A caller asked for what needs the library preloaded (statistics, a lease-mode wait): without it,
// a NOTICE with the setting to change, once per backend.
void preload_notice_if_missing();

} // namespace idem
