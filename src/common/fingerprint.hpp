// Request fingerprints: what they are, docs/concepts.md "Fingerprints"; how they are computed,
// docs/design.md "Fingerprint".
#pragma once

#include "common/pg.hpp"

namespace idem {

// SHA-256 of the scope, a 0x00 byte and the jsonb's canonical text, as a bytea. In the canonical
// text every number is written with the fewest fraction digits that keep its value (42.0 and
// 420e-1 as 42, 1.50 as 1.5), so numbers equal as jsonb give one fingerprint. A request with no
// such number has the same fingerprint as under 1.1.
bytea *request_fingerprint(text *scope, Jsonb *request);

// 1.1's fingerprint, where numbers keep the scale they were written with: for a table not yet
// updated to 1.2, and to recognise keys that 1.1 stored.
bytea *request_fingerprint_1_1(text *scope, Jsonb *request);

} // namespace idem
