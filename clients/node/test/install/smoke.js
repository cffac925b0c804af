// Run from an application that installed the package (a packed tarball or a path): the package's
// entry points load, and a key is claimed, completed and replayed in the database of PG* variables.
'use strict';
const assert = require('node:assert/strict');
const { Pool } = require('pg');
const { IdempotencyStore, runInTransaction, httpFingerprint } = require('pg-idempotency');
const { idempotent, keepRawBody } = require('pg-idempotency/express');
const { fastifyIdempotency } = require('pg-idempotency/fastify');

async function main() {
  assert.equal(typeof idempotent, 'function');
  assert.equal(typeof keepRawBody, 'function');
  assert.equal(typeof fastifyIdempotency, 'function');
  const pool = new Pool({ max: 2 });
  try {
    const store = new IdempotencyStore(pool);
    const key = `installed-${process.pid}-${Date.now()}`;
    const fingerprint = httpFingerprint({ method: 'POST', target: '/smoke', rawHeaders: [], body: Buffer.from('{}') });
    const work = async () => ({ response: { ok: true }, responseCode: 201 });
    const first = await runInTransaction(store, { key, scope: 'smoke', fingerprint }, work);
    assert.equal(first.outcome, 'executed');
    const again = await runInTransaction(store, { key, scope: 'smoke', fingerprint }, work);
    assert.equal(again.outcome, 'replay');
    assert.equal(again.claim.responseCode, 201);
    console.log(`the installed package works (extension ${await store.version()})`);
  } finally {
    await pool.end();
  }
}
main().catch((err) => {
  console.error(err);
  process.exit(1);
});
