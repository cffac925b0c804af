<?php
// The SQL API from PHP with PDO (PDO_pgsql, in Debian's php-pgsql): binding jsonb, bytea and
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

// PDO returns a bytea column as a stream.
function bytea(mixed $value): ?string
{
    return is_resource($value) ? stream_get_contents($value) : $value;
}

// The rows of a statement run with its parameters bound as strings (jsonb, text, arrays).
function rows(PDO $pdo, string $sql, array $params): array
{
    $st = $pdo->prepare($sql);
    $st->execute($params);
    return $st->fetchAll(PDO::FETCH_ASSOC);
}

$pdo = new PDO('pgsql:', null, null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
$allBytes = implode('', array_map('chr', range(0, 255)));

// jsonb: a string parameter (the server takes it as jsonb); enums come back as strings.
$r = rows($pdo, 'SELECT outcome, state, attempt FROM idem_claim(?, request => ?)',
          ['order-1', '{"sku": "A-1", "qty": 2}'])[0];
check($r['outcome'] === 'claimed' && $r['state'] === 'pending' && $r['attempt'] === 1,
      'claim: outcome claimed, state pending, attempt 1 (enums read as text)', $r);

// A body bound as a string (PDO::PARAM_STR, execute's array) goes as text: cut at its first NUL.
foreach (["ab\0cd\xff", $allBytes] as $sent) {
    $key = 'plain-' . strlen($sent);
    rows($pdo, 'SELECT * FROM idem_claim(?)', [$key]);
    rows($pdo, 'SELECT * FROM idem_complete(?, NULL, 200, body => ?)', [$key, $sent]);
    $stored = bytea(rows($pdo, 'SELECT response_body FROM idem_lookup(?)', [$key])[0]['response_body']);
    check($stored !== $sent && strlen($stored) === strpos($sent, "\0"),
          sprintf('a %d-byte body bound as a string is stored cut at its first NUL (%d bytes)',
                  strlen($sent), strlen($stored)), strlen((string) $stored));
}

// bytea: bindValue(..., PDO::PARAM_LOB) sends the bytes as they are.
$st = $pdo->prepare('SELECT state FROM idem_complete(?, ?, 201, attempt => ?, body => ?)');
$st->bindValue(1, 'order-1');
$st->bindValue(2, '{"order": 42}');
$st->bindValue(3, $r['attempt'], PDO::PARAM_INT);
$st->bindValue(4, $allBytes, PDO::PARAM_LOB);
$st->execute();
$state = $st->fetchColumn();
check($state === 'succeeded', 'complete with a jsonb response and a bytea body of all 256 byte values', $state);

$r = rows($pdo, 'SELECT outcome, state, response, response_code, response_body FROM idem_claim(?, request => ?)',
          ['order-1', '{"qty": 2, "sku": "A-1"}'])[0];
check($r['outcome'] === 'replay' && $r['state'] === 'succeeded' && $r['response'] === '{"order": 42}'
      && $r['response_code'] === 201,
      'replay: outcome replay, state succeeded, the jsonb response and code 201', $r['response']);
$body = bytea($r['response_body']);
check($body === $allBytes, 'replay: response_body byte for byte (256 values)', strlen((string) $body));

$body = bytea(rows($pdo, 'SELECT response_body FROM idem_lookup(?)', ['order-1'])[0]['response_body']);
check($body === $allBytes, 'idem_lookup: response_body byte for byte', strlen((string) $body));

// IK001: the same key with another request; PDOException::getCode() is the SQLSTATE.
try {
    rows($pdo, 'SELECT * FROM idem_claim(?, request => ?)', ['order-1', '{"sku": "B-2"}']);
    check(false, 'same key, another request: SQLSTATE IK001', 'no error');
} catch (PDOException $e) {
    check($e->getCode() === 'IK001', 'same key, another request: SQLSTATE IK001', $e->getCode());
}

// IK004: the finished key completed again; 22023: a key with a newline.
foreach ([['SELECT * FROM idem_complete(?, NULL)', 'order-1', 'IK004', 'the finished key completed again'],
          ['SELECT * FROM idem_claim(?)', "bad\nkey", '22023', 'a key with a newline']] as [$sql, $key, $want, $what]) {
    try {
        rows($pdo, $sql, [$key]);
        check(false, "$what: SQLSTATE $want", 'no error');
    } catch (PDOException $e) {
        check($e->getCode() === $want, "$what: SQLSTATE $want", $e->getCode());
    }
}

// Arrays: an array literal built by hand (pg_array_literal above); bytea[] elements as hex text.
$batchKey = 'b-2 {"x\y"}'; // quotes, braces, a backslash and a space
$keys = ['b-1', $batchKey];
$got = array_map(fn (array $row) => "$row[key]=$row[outcome]",
                 rows($pdo, 'SELECT key, outcome FROM idem_claim_batch(?, requests => ?)',
                      [pg_array_literal($keys), pg_array_literal(['{"n": 1}', '{"n": 2}'])]));
check($got === ['b-1=claimed', "$batchKey=claimed"],
      'batch claim with text[] keys and jsonb[] requests: both claimed, in key order', $got);

$fingerprints = ["\x00\xff\\\"", substr($allBytes, 0, 64)];
rows($pdo, 'SELECT * FROM idem_claim_batch(?, fingerprints => ?)',
     [pg_array_literal(['f-1', 'f-2']), pg_array_literal(array_map(fn (string $b) => '\x' . bin2hex($b), $fingerprints))]);
$row = rows($pdo, "SELECT (idem_lookup('f-1')).fingerprint AS f1, (idem_lookup('f-2')).fingerprint AS f2", [])[0];
$got = [bytea($row['f1']), bytea($row['f2'])];
check($got === $fingerprints, 'batch claim with bytea[] fingerprints: stored byte for byte', array_map('bin2hex', $got));

// A batch error: PDO does not expose the column-name field. Its message carries the CONTEXT
// line, whose "element N of argument "keys"" is the failing key's subscript (1-based).
$keys = ['b-3', $batchKey];
try {
    rows($pdo, 'SELECT * FROM idem_claim_batch(?, requests => ?)',
         [pg_array_literal($keys), pg_array_literal(['{"n": 3}', '{"n": 4}'])]);
    check(false, 'batch with a reused key: IK001, the CONTEXT names the failing key\'s element', 'no error');
} catch (PDOException $e) {
    $failedKey = preg_match('/^CONTEXT: .*, element (\d+) of argument "keys"$/m', $e->errorInfo[2], $m)
        ? $keys[(int) $m[1] - 1] : null;
    check($e->getCode() === 'IK001' && $failedKey === $batchKey,
          'batch with a reused key: IK001, the CONTEXT names the failing key\'s element', $e->errorInfo);
}

exit($failures === 0 ? 0 : 1);
