/**
 * The Express application the HTTP tests run, in-process or as a child process (`node app.js`,
 * printing "listening <port>") so that a test can kill -9 it in the middle of a handler.
 */
import express, { type NextFunction, type Request, type Response } from 'express';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { Pool } from 'pg';
import { IdempotencyStore } from '../src';
import { idempotent, keepRawBody } from '../src/express';
import { sleep, type Gates } from './helpers';

export interface AppOptions {
  leaseMs?: number;
  heartbeatMs?: number | false;
  /** Mount the routes whose duplicates wait for the owner (the claim option `wait`, 1.2). */
  waitRoutes?: boolean;
  /** The handler of a request with the header `x-hold: NAME` waits for `gates.open(NAME)`. */
  gates?: Gates;
}

class HttpError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

async function work(req: Request, gates: Gates | undefined) {
  // hang, hold and failure are headers, not part of the fingerprint: a retry is the same request
  const hangMs = Number(req.headers['x-hang-ms'] ?? 0);
  const hold = req.headers['x-hold'];
  const fail = req.headers['x-fail'];
  if (hangMs > 0) {
    process.stdout.write(`handling ${String(req.headers['idempotency-key'])}\n`);
    await sleep(hangMs);
  }
  if (typeof hold === 'string') {
    if (gates === undefined) throw new Error('x-hold needs the application built with gates');
    await gates.wait(hold);
  }
  if (fail === 'retryable') throw new Error('downstream unavailable');
  if (fail === 'terminal') throw new HttpError(400, 'card declined');
}

export function buildApp(store: IdempotencyStore, options: AppOptions = {}) {
  const app = express();
  app.use(express.json({ verify: keepRawBody }));

  const createOrder = async (req: Request, res: Response) => {
    const ctx = req.idempotency!;
    const { rows } = await ctx.client!.query('INSERT INTO orders (idem_key, item) VALUES ($1, $2) RETURNING id', [
      ctx.key,
      String((req.body as { item?: unknown }).item ?? ''),
    ]);
    await work(req, options.gates);
    res
      .status(201)
      .set('Location', `/orders/${rows[0].id}`)
      .set('X-Order-Token', randomUUID())
      .set('X-Not-Replayed', randomUUID())
      // key order and spacing that jsonb would not keep: the replay must still be byte-exact
      .type('application/json')
      .send(`{"z": 1,  "id": ${rows[0].id}, "token": "${randomUUID()}", "a": [1.50, "é\\u00e9"]}`);
  };
  const replayHeaders = ['content-type', 'location', 'x-order-token'];
  app.post('/orders', idempotent(store, { public: true, required: true, replayHeaders }), createOrder);
  // under REPEATABLE READ a duplicate that waited for the first claim's commit gets 40001: retried
  app.post('/orders-rr', idempotent(store, { public: true, required: true, replayHeaders, isolationLevel: 'REPEATABLE READ' }), createOrder);

  app.post(
    '/payments',
    idempotent(store, { public: true, mode: 'lease', required: true, lease: options.leaseMs ?? 1000, heartbeatMs: options.heartbeatMs ?? false }),
    async (req, res) => {
      const ctx = req.idempotency!;
      // the provider's own idempotency key is ours: a second attempt does not charge twice
      await store.pool.query(
        'INSERT INTO provider_charges (idem_key, attempt) VALUES ($1, $2) ON CONFLICT (idem_key) DO NOTHING',
        [ctx.key, ctx.attempt],
      );
      await store.pool.query('INSERT INTO effects (idem_key, attempt) VALUES ($1, $2)', [ctx.key, ctx.attempt]);
      await work(req, options.gates);
      res.status(201).json({ attempt: ctx.attempt, aborted: ctx.signal.aborted, token: randomUUID() });
    },
  );

  // 1.2: a duplicate waits (up to 15 s) for the owner's result instead of answering 409
  if (options.waitRoutes) {
    app.post(
      '/payments-wait',
      idempotent(store, { public: true, mode: 'lease', required: true, lease: 30_000, heartbeatMs: false, wait: 15_000 }),
      async (req, res) => {
        const ctx = req.idempotency!;
        await store.pool.query('INSERT INTO effects (idem_key, attempt) VALUES ($1, $2)', [ctx.key, ctx.attempt]);
        await work(req, options.gates);
        res.status(201).json({ attempt: ctx.attempt, token: randomUUID() });
      },
    );
    app.post('/orders-wait', idempotent(store, { public: true, required: true, replayHeaders, wait: 15_000 }), createOrder);
  }

  app.post('/optional', idempotent(store, { public: true }), (_req, res) => {
    res.json({ token: randomUUID() });
  });

  app.use((err: Error, _req: Request, res: Response, _next: NextFunction) => {
    res.status(err instanceof HttpError ? err.status : 500).json({ error: err.message });
  });
  return app;
}

export async function listen(app: express.Express) {
  return new Promise<{ url: string; close: () => Promise<void> }>((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      // an idle connection outlives any gap between a test's requests (30 s, under the 60 s
      // headersTimeout): with Node's default of 5 s the server could close it just as a client
      // busy in its own work (stringifying 4 MB on a loaded machine) reuses it: ECONNRESET
      server.keepAliveTimeout = 30_000;
      const { port } = server.address() as AddressInfo;
      resolve({
        url: `http://127.0.0.1:${port}`,
        close: () =>
          new Promise<void>((done) => {
            server.closeAllConnections();
            server.close(() => done());
          }),
      });
    });
  });
}

if (require.main === module) {
  const pool = new Pool({ max: 20 });
  const heartbeat = process.env.HEARTBEAT_MS;
  const app = buildApp(new IdempotencyStore(pool), {
    leaseMs: Number(process.env.LEASE_MS ?? 1000),
    heartbeatMs: heartbeat ? Number(heartbeat) : false,
  });
  void listen(app).then(({ url }) => process.stdout.write(`listening ${url}\n`));
}
