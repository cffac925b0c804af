<?php
// The SQL API from PHP with the pgsql extension (Debian's php-pgsql): binding jsonb, bytea and
// arrays, reading results and enums, catching SQLSTATEs and a batch error's failing key.
// It connects with the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE), prints
// one line per check and exits 1 if any failed.
declare(strict_types=1);

$failures = 0;

function check(bool $ok, string $what, mixed $got = null): void
{
    global $failures;
    if ($ok) {
        echo "ok: $what\n";
        return;
    }
    $failures++;
    echo "FAILED: $what; got: ", var_export($got, true), "\n";
}

// A PostgreSQL array literal of strings: each element double-quoted, '"' and '\' escaped.
function pg_array_literal(array $items): string
{
    return '{' . implode(',', array_map(fn (string $s) => '"' . addcslashes($s, '"\\') . '"', $items)) . '}';
}

// Runs a statement and returns its result, failed or not: pg_query_params gives only false on an
// error, pg_get_result the result with its error fields (PGSQL_DIAG_SQLSTATE, ..._COLUMN_NAME).
function query_result(PgSql\Connection $conn, string $sql, array $params): PgSql\Result
{
    pg_send_query_params($conn, $sql, $params);
    $result = pg_get_result($conn);
    while (pg_get_result($conn) !== false) {
    }
    return $result;
}

$conn = pg_connect('');
$allBytes = implode('', array_map('chr', range(0, 255)));

// jsonb: a string parameter (the server takes it as jsonb); enums come back as strings.
$r = pg_fetch_assoc(pg_query_params($conn, 'SELECT outcome, state, attempt FROM idem_claim($1, request => $2)',
                                    ['order-1', '{"sku": "A-1", "qty": 2}']));
check($r['outcome'] === 'claimed' && $r['state'] === 'pending' && $r['attempt'] === '1',
      'claim: outcome claimed, state pending, attempt 1 (enums read as text)', $r);

// A body passed as a plain string goes as text: it is cut at its first NUL byte, with no error.
foreach (["ab\0cd\xff", $allBytes] as $sent) {
    $key = 'plain-' . strlen($sent);
    pg_query_params($conn, 'SELECT * FROM idem_claim($1)', [$key]);
    pg_query_params($conn, 'SELECT * FROM idem_complete($1, NULL, 200, body => $2)', [$key, $sent]);
    $stored = pg_unescape_bytea(pg_fetch_result(
        pg_query_params($conn, 'SELECT response_body FROM idem_lookup($1)', [$key]), 0, 0));
    check($stored !== $sent && strlen($stored) === strpos($sent, "\0"),
          sprintf('a %d-byte body passed as a plain string is stored cut at its first NUL (%d bytes)',
                  strlen($sent), strlen($stored)), strlen($stored));
}

// bytea: pass pg_escape_bytea($conn, $body) (bytea's text form); read with pg_unescape_bytea.
$state = pg_fetch_result(pg_query_params($conn,
    'SELECT state FROM idem_complete($1, $2, 201, attempt => $3, body => $4)',
    ['order-1', '{"order": 42}', $r['attempt'], pg_escape_bytea($conn, $allBytes)]), 0, 0);
check($state === 'succeeded', 'complete with a jsonb response and a bytea body of all 256 byte values', $state);

$r = pg_fetch_assoc(pg_query_params($conn, 'SELECT outcome, state, response, response_code, response_body
                                              FROM idem_claim($1, request => $2)',
                                    ['order-1', '{"qty": 2, "sku": "A-1"}']));
check($r['outcome'] === 'replay' && $r['state'] === 'succeeded' && $r['response'] === '{"order": 42}'
      && $r['response_code'] === '201',
      'replay: outcome replay, state succeeded, the jsonb response and code 201', $r['response']);
$body = pg_unescape_bytea($r['response_body']);
check($body === $allBytes, 'replay: response_body byte for byte (256 values)', strlen($body));

$body = pg_unescape_bytea(pg_fetch_result(
    pg_query_params($conn, 'SELECT response_body FROM idem_lookup($1)', ['order-1']), 0, 0));
check($body === $allBytes, 'idem_lookup: response_body byte for byte', strlen($body));

// IK001: the same key with another request.
$res = query_result($conn, 'SELECT * FROM idem_claim($1, request => $2)', ['order-1', '{"sku": "B-2"}']);
check(pg_result_error_field($res, PGSQL_DIAG_SQLSTATE) === 'IK001', 'same key, another request: SQLSTATE IK001',
      pg_result_error($res));

// IK004: the finished key completed again; 22023: a key with a newline.
foreach ([['SELECT * FROM idem_complete($1, NULL)', 'order-1', 'IK004', 'the finished key completed again'],
          ['SELECT * FROM idem_claim($1)', "bad\nkey", '22023', 'a key with a newline']] as [$sql, $key, $want, $what]) {
    $res = query_result($conn, $sql, [$key]);
    check(pg_result_error_field($res, PGSQL_DIAG_SQLSTATE) === $want, "$what: SQLSTATE $want", pg_result_error($res));
}

// Arrays: an array literal built by hand (pg_array_literal above); bytea[] elements as hex text.
$batchKey = 'b-2 {"x\y"}'; // quotes, braces, a backslash and a space
$res = pg_query_params($conn, 'SELECT key, outcome FROM idem_claim_batch($1, requests => $2)',
                       [pg_array_literal(['b-1', $batchKey]), pg_array_literal(['{"n": 1}', '{"n": 2}'])]);
$got = array_map(fn (array $row) => "$row[key]=$row[outcome]", pg_fetch_all($res));
check($got === ['b-1=claimed', "$batchKey=claimed"],
      'batch claim with text[] keys and jsonb[] requests: both claimed, in key order', $got);

$fingerprints = ["\x00\xff\\\"", substr($allBytes, 0, 64)];
pg_query_params($conn, 'SELECT * FROM idem_claim_batch($1, fingerprints => $2)',
                [pg_array_literal(['f-1', 'f-2']),
                 pg_array_literal(array_map(fn (string $b) => '\x' . bin2hex($b), $fingerprints))]);
$row = pg_fetch_row(pg_query($conn, "SELECT (idem_lookup('f-1')).fingerprint, (idem_lookup('f-2')).fingerprint"));
$got = array_map('pg_unescape_bytea', $row);
check($got === $fingerprints, 'batch claim with bytea[] fingerprints: stored byte for byte', $row);

// A batch error names the failing key in the column-name field.
$res = query_result($conn, 'SELECT * FROM idem_claim_batch($1, requests => $2)',
                    [pg_array_literal(['b-3', $batchKey]), pg_array_literal(['{"n": 3}', '{"n": 4}'])]);
$got = [pg_result_error_field($res, PGSQL_DIAG_SQLSTATE), pg_result_error_field($res, PGSQL_DIAG_COLUMN_NAME)];
check($got === ['IK001', $batchKey], 'batch with a reused key: IK001, PGSQL_DIAG_COLUMN_NAME is the failing key', $got);

pg_close($conn);
exit($failures === 0 ? 0 : 1);
