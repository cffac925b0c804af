# The SQL API from Ruby with the pg gem (Debian's ruby-pg): binding jsonb, bytea and arrays,
# reading results and enums, catching SQLSTATEs and a batch error's failing key.
# It connects with the libpq environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE), prints
# one line per check and exits 1 if any failed.
require 'pg'

$failures = 0

def check(ok, what, got = nil)
  if ok
    puts "ok: #{what}"
  else
    $failures += 1
    puts "FAILED: #{what}; got: #{got.inspect}"
  end
end

conn = PG.connect
all_bytes = (0..255).to_a.pack('C*')

# jsonb: a string parameter (untyped: the server takes it as jsonb); enums come back as strings.
r = conn.exec_params('SELECT outcome, state, attempt FROM idem_claim($1, request => $2)',
                     ['order-1', '{"sku": "A-1", "qty": 2}'])[0]
check(r['outcome'] == 'claimed' && r['state'] == 'pending' && r['attempt'] == '1',
      'claim: outcome claimed, state pending, attempt 1 (enums read as text)', r)

# A string with a NUL byte as a text parameter: the gem refuses it (a C string ends at NUL).
begin
  conn.exec_params('SELECT * FROM idem_complete($1, NULL, 201, body => $2)', ['order-1', "ab\0cd\xff".b])
  check(false, 'a body with a NUL byte bound as a plain string is refused', 'no error')
rescue ArgumentError => e
  check(true, "a body with a NUL byte bound as a plain string is refused (#{e.class}: #{e.message})")
end

# bytea: a parameter in binary format, { value:, format: 1 }, keeps every byte.
state = conn.exec_params('SELECT state FROM idem_complete($1, $2, 201, attempt => $3, body => $4)',
                         ['order-1', '{"order": 42}', r['attempt'], { value: all_bytes, format: 1 }])[0]['state']
check(state == 'succeeded', 'complete with a jsonb response and a bytea body of all 256 byte values', state)

r = conn.exec_params('SELECT outcome, state, response, response_code, response_body
                        FROM idem_claim($1, request => $2)', ['order-1', '{"qty": 2, "sku": "A-1"}'])[0]
check(r['outcome'] == 'replay' && r['state'] == 'succeeded' && r['response'] == '{"order": 42}' &&
      r['response_code'] == '201',
      'replay: outcome replay, state succeeded, the jsonb response and code 201', r)
# bytea results are text (hex) unless decoded: PG::Connection.unescape_bytea.
body = PG::Connection.unescape_bytea(r['response_body'])
check(body == all_bytes, 'replay: response_body byte for byte (256 values)', body.bytesize)

body = PG::Connection.unescape_bytea(conn.exec_params('SELECT response_body FROM idem_lookup($1)',
                                                      ['order-1'])[0]['response_body'])
check(body == all_bytes, 'idem_lookup: response_body byte for byte', body.bytesize)

# IK001: the same key with another request.
begin
  conn.exec_params('SELECT * FROM idem_claim($1, request => $2)', ['order-1', '{"sku": "B-2"}'])
  check(false, 'same key, another request: SQLSTATE IK001', 'no error')
rescue PG::Error => e
  check(e.result.error_field(PG::PG_DIAG_SQLSTATE) == 'IK001', 'same key, another request: SQLSTATE IK001',
        e.message)
end

# IK004: the finished key completed again; 22023: a key with a newline.
[['SELECT * FROM idem_complete($1, NULL)', 'order-1', 'IK004', 'the finished key completed again'],
 ['SELECT * FROM idem_claim($1)', "bad\nkey", '22023', 'a key with a newline']].each do |sql, key, want, what|
  conn.exec_params(sql, [key])
  check(false, "#{what}: SQLSTATE #{want}", 'no error')
rescue PG::Error => e
  sqlstate = e.result.error_field(PG::PG_DIAG_SQLSTATE)
  check(sqlstate == want, "#{what}: SQLSTATE #{want}", sqlstate)
end

# Arrays: PG::TextEncoder::Array writes the array literal (quoting and escaping the elements);
# with a PG::TextEncoder::Bytea for the elements, a bytea[].
text_array = PG::TextEncoder::Array.new
bytea_array = PG::TextEncoder::Array.new(elements_type: PG::TextEncoder::Bytea.new)
batch_key = 'b-2 {"x\y"}' # quotes, braces, a backslash and a space
rows = conn.exec_params('SELECT key, outcome FROM idem_claim_batch($1, requests => $2)',
                        [text_array.encode(['b-1', batch_key]), text_array.encode(['{"n": 1}', '{"n": 2}'])])
got = rows.map { |row| "#{row['key']}=#{row['outcome']}" }
check(got == ['b-1=claimed', "#{batch_key}=claimed"],
      'batch claim with text[] keys and jsonb[] requests: both claimed, in key order', got)

fingerprints = ["\x00\xff\\\"".b, all_bytes[0, 64]]
conn.exec_params('SELECT * FROM idem_claim_batch($1, fingerprints => $2)',
                 [text_array.encode(%w[f-1 f-2]), bytea_array.encode(fingerprints)])
r = conn.exec("SELECT (idem_lookup('f-1')).fingerprint AS f1, (idem_lookup('f-2')).fingerprint AS f2")[0]
got = [PG::Connection.unescape_bytea(r['f1']), PG::Connection.unescape_bytea(r['f2'])]
check(got == fingerprints, 'batch claim with bytea[] fingerprints: stored byte for byte', got)

# A batch error names the failing key in the column-name field.
begin
  conn.exec_params('SELECT * FROM idem_claim_batch($1, requests => $2)',
                   [text_array.encode(['b-3', batch_key]), text_array.encode(['{"n": 3}', '{"n": 4}'])])
  check(false, 'batch with a reused key: IK001, PG_DIAG_COLUMN_NAME is the failing key', 'no error')
rescue PG::Error => e
  got = [e.result.error_field(PG::PG_DIAG_SQLSTATE), e.result.error_field(PG::PG_DIAG_COLUMN_NAME)]
  check(got == ['IK001', batch_key], 'batch with a reused key: IK001, PG_DIAG_COLUMN_NAME is the failing key', got)
end

conn.close
exit($failures.zero? ? 0 : 1)
