/**
 * Same-transaction mode's start, BEGIN + claim + SAVEPOINT then ROLLBACK, on a key that replays:
 * the one exchange of src/protocol.ts (driver internals) against the public API (three queries,
 * each awaited). Both in one run, alternating rounds; prints calls per second and the ratio.
 * Needs a database with the extension (PG* variables).
 */
import { randomUUID } from 'node:crypto';
import { Pool, type PoolClient } from 'pg';
import { IdempotencyStore } from '../src';

const ROUNDS = Number(process.env.ROUNDS ?? 10);
const CALLS = Number(process.env.CALLS ?? 2000);

async function main() {
  const pool = new Pool({ max: 1 });
  const store = new IdempotencyStore(pool);
  const key = `bench-${randomUUID()}`;
  const options = { key, scope: 'bench', fingerprint: Buffer.alloc(32, 1) };
  await store.claim(pool, options);
  await store.complete(pool, { key, scope: 'bench', response: { ok: true } });
  const client = await pool.connect();
  const oneExchange = async (c: PoolClient) => {
    await store.beginAndClaim(c, options, undefined, 'idempotency_handler');
    await c.query('ROLLBACK');
  };
  const publicApi = async (c: PoolClient) => {
    await c.query('BEGIN');
    await store.claim(c, options);
    await c.query('SAVEPOINT idempotency_handler');
    await c.query('ROLLBACK');
  };
  const time = async (run: (c: PoolClient) => Promise<void>) => {
    const start = process.hrtime.bigint();
    for (let i = 0; i < CALLS; i++) await run(client);
    return Number(process.hrtime.bigint() - start) / 1e9;
  };
  await time(oneExchange);
  await time(publicApi);
  let internal = 0;
  let pub = 0;
  for (let round = 0; round < ROUNDS; round++) {
    internal += await time(oneExchange);
    pub += await time(publicApi);
  }
  const total = ROUNDS * CALLS;
  console.log(`one exchange (src/protocol.ts): ${(total / internal).toFixed(0)} calls/s`);
  console.log(`public API (3 awaited queries):  ${(total / pub).toFixed(0)} calls/s`);
  console.log(`public / one exchange: ${(internal / pub).toFixed(3)} of the speed`);
  client.release();
  await pool.end();
}

void main();
