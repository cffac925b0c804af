// Request fingerprints (SPEC §3).
#pragma once

#include "common/pg.hpp"

namespace idem {

// SHA-256 of the scope, a 0x00 byte and the jsonb's canonical text, as a bytea.
bytea *request_fingerprint(text *scope, Jsonb *request);

} // namespace idem
