// The SQL API from Node.js with node-postgres (pg), without the client library (clients/node
// wraps these calls): binding jsonb, bytea and arrays, reading results and enums, catching
// SQLSTATEs and a batch error's failing key. It connects with the libpq environment variables
// (PGHOST, PGPORT, PGUSER, PGDATABASE), prints one line per check and exits 1 if any failed.
"use strict";
const { Client } = require("pg");

let failures = 0;
function check(ok, what, got) {
  if (ok) {
    console.log(`ok: ${what}`);
  } else {
    failures++;
    console.log(`FAILED: ${what}; got: ${JSON.stringify(got)}`);
  }
}

// The error a promise rejects with, or null if it resolves.
async function errorOf(promise) {
  try {
    await promise;
    return null;
  } catch (err) {
    return err;
  }
}

async function main() {
  const client = new Client();
  await client.connect();
  const allBytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  try {
    // jsonb: a string of JSON (JSON.stringify); enums come back as strings.
    let { rows } = await client.query("SELECT outcome, state, attempt FROM idem_claim($1, request => $2)",
      ["order-1", JSON.stringify({ sku: "A-1", qty: 2 })]);
    check(rows[0].outcome === "claimed" && rows[0].state === "pending" && rows[0].attempt === 1,
      "claim: outcome claimed, state pending, attempt 1 (enums read as text)", rows[0]);

    // bytea: a Buffer binds as bytea, every byte value kept; bytea results are Buffers.
    ({ rows } = await client.query("SELECT state FROM idem_complete($1, $2, 201, attempt => $3, body => $4)",
      ["order-1", JSON.stringify({ order: 42 }), 1, allBytes]));
    check(rows[0].state === "succeeded", "complete with a jsonb response and a bytea body of all 256 byte values", rows[0]);

    ({ rows } = await client.query(`SELECT outcome, state, response, response_code, response_body
                                      FROM idem_claim($1, request => $2)`,
      ["order-1", JSON.stringify({ qty: 2, sku: "A-1" })]));
    const r = rows[0];
    check(r.outcome === "replay" && r.state === "succeeded" && r.response.order === 42 && r.response_code === 201,
      "replay: outcome replay, state succeeded, the jsonb response (parsed) and code 201", r);
    check(allBytes.equals(r.response_body), "replay: response_body byte for byte (256 values)", r.response_body);

    ({ rows } = await client.query("SELECT response_body FROM idem_lookup($1)", ["order-1"]));
    check(allBytes.equals(rows[0].response_body), "idem_lookup: response_body byte for byte", rows[0]);

    // IK001: the same key with another request; err.code is the SQLSTATE.
    let err = await errorOf(client.query("SELECT * FROM idem_claim($1, request => $2)",
      ["order-1", JSON.stringify({ sku: "B-2" })]));
    check(err?.code === "IK001", "same key, another request: SQLSTATE IK001", err?.code);

    // IK004: the finished key completed again; 22023: a key with a newline.
    for (const [sql, key, want, what] of [
      ["SELECT * FROM idem_complete($1, NULL)", "order-1", "IK004", "the finished key completed again"],
      ["SELECT * FROM idem_claim($1)", "bad\nkey", "22023", "a key with a newline"],
    ]) {
      err = await errorOf(client.query(sql, [key]));
      check(err?.code === want, `${what}: SQLSTATE ${want}`, err?.code);
    }

    // Arrays: a JavaScript array binds as an array literal (elements quoted and escaped; Buffers
    // as bytea hex), so one of strings serves text[] and jsonb[], one of Buffers bytea[].
    const batchKey = 'b-2 {"x\\y"}'; // quotes, braces, a backslash and a space
    ({ rows } = await client.query("SELECT key, outcome FROM idem_claim_batch($1, requests => $2)",
      [["b-1", batchKey], [JSON.stringify({ n: 1 }), JSON.stringify({ n: 2 })]]));
    const got = rows.map((row) => `${row.key}=${row.outcome}`);
    check(got.join("|") === `b-1=claimed|${batchKey}=claimed`,
      "batch claim with text[] keys and jsonb[] requests: both claimed, in key order", got);

    const fingerprints = [Buffer.from([0x00, 0xff, 0x5c, 0x22]), allBytes.subarray(0, 64)];
    await client.query("SELECT * FROM idem_claim_batch($1, fingerprints => $2)", [["f-1", "f-2"], fingerprints]);
    ({ rows } = await client.query("SELECT (idem_lookup('f-1')).fingerprint AS f1, (idem_lookup('f-2')).fingerprint AS f2"));
    check(fingerprints[0].equals(rows[0].f1) && fingerprints[1].equals(rows[0].f2),
      "batch claim with bytea[] fingerprints: stored byte for byte", rows[0]);

    // A batch error names the failing key in the column-name field: err.column.
    err = await errorOf(client.query("SELECT * FROM idem_claim_batch($1, requests => $2)",
      [["b-3", batchKey], [JSON.stringify({ n: 3 }), JSON.stringify({ n: 4 })]]));
    check(err?.code === "IK001" && err?.column === batchKey,
      "batch with a reused key: IK001, err.column is the failing key", [err?.code, err?.column]);
  } finally {
    await client.end();
  }
  process.exitCode = failures ? 1 : 0;
}

main().catch((err) => {
  console.log(`FAILED: ${err.stack}`);
  process.exitCode = 1;
});
