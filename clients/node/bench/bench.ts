/**
 * Requests per second of one Express endpoint (POST /orders, same-transaction mode: claim, insert,
 * complete, commit) with the middleware vs the same endpoint with minimal hand-written glue, same
 * framework and database, in interleaved rounds; and the database round trips of a replay.
 *
 *   node dist/bench/bench.js [--seconds 5] [--rounds 3] [--concurrency 16]
 * Connection from the PG* environment variables; the database needs the extension.
 */
import express, { type NextFunction, type Request, type Response } from 'express';
import type { EventEmitter } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client, Pool, type ClientConfig } from 'pg';
import { IdempotencyStore } from '../src';
import { idempotent, keepRawBody } from '../src/express';

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? fallback : Number(process.argv[i + 1]);
};
const seconds = arg('seconds', 5);
const rounds = arg('rounds', 3);
const concurrency = arg('concurrency', 16);

/** Counts the exchanges with the server (round trips): each one ends with a ReadyForQuery. */
let exchanges = 0;
class CountingClient extends Client {
  constructor(config?: string | ClientConfig) {
    super(config);
    (this as unknown as { connection: EventEmitter }).connection.on('readyForQuery', () => {
      exchanges++;
    });
  }
}
/** Exchanges finished when the last response was handed to Node. */
let exchangesAtAnswer = 0;

function middlewareApp(store: IdempotencyStore, mode: 'transaction' | 'lease') {
  const app = express();
  app.use((_req: Request, res: Response, next: NextFunction) => {
    const end = res.end;
    res.end = function (this: Response, ...args: unknown[]) {
      exchangesAtAnswer = exchanges;
      return (end as (...a: unknown[]) => Response).apply(this, args);
    } as Response['end'];
    next();
  });
  app.use(express.json({ verify: keepRawBody }));
  app.post('/orders', idempotent(store, { public: true, required: true, mode }), async (req, res) => {
    const ctx = req.idempotency!;
    const db = ctx.client ?? store.pool;
    const { rows } = await db.query('INSERT INTO bench_orders (item) VALUES ($1) RETURNING id', [req.body.item]);
    res.status(201).json({ id: rows[0].id });
  });
  return app;
}

/** What a user would write by hand for the same endpoint (no byte-exact replay, no retries). */
function handWrittenApp(pool: Pool) {
  const app = express();
  app.use(express.json({ verify: keepRawBody }));
  app.post('/orders', async (req, res) => {
    const key = req.get('idempotency-key');
    if (!key) {
      res.status(400).json({ error: 'missing key' });
      return;
    }
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const { rows: [claim] } = await client.query(
        "SELECT c.outcome::text AS outcome, c.response, c.response_code, ceil(extract(epoch FROM c.retry_after)) AS retry FROM idem_claim($1, $2::jsonb, 'POST /orders') AS c",
        [key, JSON.stringify(req.body)],
      );
      if (claim.outcome !== 'claimed') {
        await client.query('ROLLBACK');
        if (claim.outcome === 'in_progress') res.status(409).set('Retry-After', String(claim.retry)).end();
        else res.status(claim.response_code).json(claim.response);
        return;
      }
      const { rows } = await client.query('INSERT INTO bench_orders (item) VALUES ($1) RETURNING id', [req.body.item]);
      const body = { id: rows[0].id };
      await client.query("SELECT FROM idem_complete($1, $2::jsonb, 201, 'POST /orders')", [key, JSON.stringify(body)]);
      await client.query('COMMIT');
      res.status(201).json(body);
    } catch {
      await client.query('ROLLBACK').catch(() => undefined);
      res.status(500).end();
    } finally {
      client.release();
    }
  });
  return app;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });

function request(port: number, key: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ item: 'book', qty: 1 });
    const req = http.request(
      { host: '127.0.0.1', port, path: '/orders', method: 'POST', agent,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'idempotency-key': key } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

let sequence = 0;
/** Requests per second, and this process's CPU microseconds per request (the app and the load
 * generator share the process, and the generator's part is the same for both variants). */
async function load(port: number): Promise<{ rps: number; cpuUs: number }> {
  const end = Date.now() + seconds * 1000;
  const cpuBefore = process.cpuUsage();
  let done = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (Date.now() < end) {
        const status = await request(port, `bench-${process.pid}-${++sequence}`);
        if (status !== 201) throw new Error(`unexpected status ${status}`);
        done++;
      }
    }),
  );
  const cpu = process.cpuUsage(cpuBefore);
  return { rps: done / seconds, cpuUs: (cpu.user + cpu.system) / done };
}

function listen(app: express.Express): Promise<{ port: number; server: http.Server }> {
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve({ port: (server.address() as AddressInfo).port, server }));
  });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main() {
  const pool = new Pool({ max: concurrency, Client: CountingClient });
  await pool.query('CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, item text)');
  const store = new IdempotencyStore(pool);
  const version = await store.version();
  const withMiddleware = await listen(middlewareApp(store, 'transaction'));
  const byHand = await listen(handWrittenApp(pool));
  const lease = await listen(middlewareApp(store, 'lease'));

  await load(withMiddleware.port); // warm-up: JIT, prepared statements, pool
  await load(byHand.port);
  const a: number[] = [];
  const b: number[] = [];
  const aCpu: number[] = [];
  const bCpu: number[] = [];
  for (let round = 0; round < rounds; round++) {
    const m = await load(withMiddleware.port);
    const h = await load(byHand.port);
    a.push(m.rps);
    b.push(h.rps);
    aCpu.push(m.cpuUs);
    bCpu.push(h.cpuUs);
    console.log(`round ${round + 1}: middleware ${m.rps.toFixed(0)} req/s ${m.cpuUs.toFixed(0)} us CPU/req, ` +
      `hand-written ${h.rps.toFixed(0)} req/s ${h.cpuUs.toFixed(0)} us CPU/req`);
  }

  const replayExchanges = async (port: number, what: string) => {
    const key = `bench-replay-${what}-${process.pid}`;
    await request(port, key);
    await new Promise((r) => setTimeout(r, 100)); // let a background ROLLBACK finish
    const before = exchanges;
    const status = await request(port, key);
    await new Promise((r) => setTimeout(r, 100));
    return { status, beforeAnswer: exchangesAtAnswer - before, total: exchanges - before };
  };
  const txReplay = await replayExchanges(withMiddleware.port, 'tx');
  const leaseReplay = await replayExchanges(lease.port, 'lease');

  console.log(`extension ${version}, ${concurrency} concurrent clients, ${rounds} rounds of ${seconds} s, medians:`);
  console.log(`  middleware (same-transaction)  ${median(a).toFixed(0)} req/s`);
  console.log(`  hand-written glue              ${median(b).toFixed(0)} req/s`);
  console.log(`  ratio middleware / hand-written ${(median(a) / median(b)).toFixed(3)}`);
  console.log(`  Node CPU per request: middleware ${median(aCpu).toFixed(0)} us, hand-written ${median(bCpu).toFixed(0)} us, ` +
    `ratio ${(median(aCpu) / median(bCpu)).toFixed(3)}`);
  for (const [what, r] of [['same-transaction mode', txReplay], ['lease mode', leaseReplay]] as const) {
    console.log(`  replay, ${what}: ${r.beforeAnswer} round trip(s) before the answer, ${r.total} in all, status ${r.status}`);
  }
  for (const s of [withMiddleware, byHand, lease]) s.server.close();
  agent.destroy();
  await pool.end();
}

void main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
