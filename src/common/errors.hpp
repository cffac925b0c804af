// The extension's own SQLSTATEs (docs/contract.md §5). Class IK: idempotency keys.
#pragma once
//
// The extension's own errors carry errhidestmt(true): the failing statement's text may hold a
// request or response body, and no server log line may (docs/contract.md §4).

#include "common/pg.hpp"

#define ERRCODE_IDEM_KEY_MISMATCH MAKE_SQLSTATE('I', 'K', '0', '0', '1')
#define ERRCODE_IDEM_ATTEMPT_STALE MAKE_SQLSTATE('I', 'K', '0', '0', '2')
#define ERRCODE_IDEM_KEY_NOT_FOUND MAKE_SQLSTATE('I', 'K', '0', '0', '3')
#define ERRCODE_IDEM_KEY_NOT_PENDING MAKE_SQLSTATE('I', 'K', '0', '0', '4')
#define ERRCODE_IDEM_KEY_IN_PROGRESS MAKE_SQLSTATE('I', 'K', '0', '0', '5')
