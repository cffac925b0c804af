/**
 * What the middleware sends to the server, counted at the protocol: every exchange ends with the
 * server's ReadyForQuery. A replay is answered after one exchange in both modes. And inputs that
 * would break a statement built as text (quotes, backslashes, unicode, megabytes) are
 * fingerprinted and replayed byte for byte.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import { after, before, describe, test } from 'node:test';
import express, { type NextFunction, type Request, type Response } from 'express';
import { Client, Pool, type ClientConfig } from 'pg';
import { IdempotencyStore } from '../src';
import { idempotent, keepRawBody } from '../src/express';
import { listen } from './app';
import { createTestDatabase, eventually, sleep, type TestDatabase } from './helpers';

let exchanges = 0;

class CountingClient extends Client {
  constructor(config?: string | ClientConfig) {
    super(config);
    (this as unknown as { connection: EventEmitter }).connection.on('readyForQuery', () => {
      exchanges++;
    });
  }
}

let db: TestDatabase;
let pool: Pool;
let server: { url: string; close: () => Promise<void> };
/** Exchanges finished when the response to the request with this key was handed to Node. */
const atAnswer = new Map<string, number>();

before(async () => {
  db = await createTestDatabase('roundtrips');
  pool = new Pool({ database: db.name, max: 2, Client: CountingClient });
  const store = new IdempotencyStore(pool);
  const app = express();
  app.use(express.json({ limit: '8mb', verify: keepRawBody }));
  app.use((req: Request, res: Response, next: NextFunction) => {
    const end = res.end;
    res.end = function (this: Response, ...args: unknown[]) {
      atAnswer.set(String(req.headers['idempotency-key']), exchanges);
      return (end as (...a: unknown[]) => Response).apply(this, args);
    } as Response['end'];
    next();
  });
  // the answer quotes the body back: what comes back must be what went in
  const answer = (req: Request, res: Response) =>
    res.status(201).type('text/plain; charset=utf-8').send(`${randomUUID()} ${JSON.stringify(req.body)}`);
  app.post('/orders', idempotent(store, { public: true, required: true, maxBodyBytes: 8 * 1024 * 1024 }), async (req, res) => {
    await req.idempotency!.client!.query('INSERT INTO orders (idem_key, item) VALUES ($1, $2)', [req.idempotency!.key, 'x']);
    answer(req, res);
  });
  app.post('/payments', idempotent(store, { public: true, mode: 'lease', required: true, heartbeatMs: false, maxBodyBytes: 8 * 1024 * 1024 }), answer);
  server = await listen(app);
  // connections and the extension's version are set up before anything is counted
  await store.version();
  await Promise.all([pool.query('SELECT pg_sleep(0.05)'), pool.query('SELECT pg_sleep(0.05)')]);
});
after(async () => {
  await server.close();
  await pool.end();
  await db.close();
});

/** The key as an sf-string: a key with spaces, quotes or backslashes needs the quoted form. */
const quoted = (key: string) => `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;

function post(route: string, key: string, body: string) {
  return fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': quoted(key) },
    body,
  });
}

/**
 * The exchanges before the answer, and in all: once `atLeast` have finished (a loaded machine
 * may delay the ROLLBACK sent after the answer) and the connections have been quiet a while.
 */
async function count(route: string, key: string, body: string, status: number, atLeast: number) {
  const start = exchanges;
  const response = await post(route, key, body);
  const bytes = Buffer.from(await response.arrayBuffer());
  assert.equal(response.status, status, bytes.toString().slice(0, 200));
  await eventually(async () => exchanges - start >= atLeast, `${atLeast} exchanges`);
  let total = exchanges;
  for (let quiet = 0; quiet < 4; ) {
    await sleep(50);
    quiet = exchanges === total ? quiet + 1 : 0;
    total = exchanges;
  }
  return { beforeAnswer: atAnswer.get(quoted(key))! - start, total: total - start, response, bytes };
}

describe('round trips', () => {
  test('same-transaction mode: BEGIN, the claim and the SAVEPOINT are one exchange: a replay is answered after it, ROLLBACK after', async () => {
    const key = `rt-tx-${randomUUID()}`;
    const first = await count('/orders', key, '{"item":"x"}', 201, 4);
    assert.equal(first.beforeAnswer, 4, 'BEGIN + claim + SAVEPOINT, INSERT, complete, COMMIT');
    assert.equal(first.total, 4);
    const replay = await count('/orders', key, '{"item":"x"}', 201, 2);
    assert.equal(replay.response.headers.get('idempotent-replayed'), 'true');
    assert.equal(replay.beforeAnswer, 1);
    assert.equal(replay.total, 2, 'the ROLLBACK, after the answer');
  });

  test('lease mode: a replay is the claim alone, one exchange', async () => {
    const key = `rt-lease-${randomUUID()}`;
    const first = await count('/payments', key, '{"amount":1}', 201, 2);
    assert.equal(first.beforeAnswer, 2, 'claim, complete');
    const replay = await count('/payments', key, '{"amount":1}', 201, 1);
    assert.equal(replay.response.headers.get('idempotent-replayed'), 'true');
    assert.equal(replay.beforeAnswer, 1);
    assert.equal(replay.total, 1);
  });
});

describe('hostile inputs are bound, never spliced into the statement', () => {
  const quoting = `O'Reilly "q" \\ \\\\ E'\\x41' $1 $$ ;-- ' OR '1'='1`;
  const unicode = '日本語 👩‍👩‍👧 عربى \u202e Ω \u00e9 e\u0301 \u2028';
  const huge = `${quoting}${unicode}`.repeat(60_000); // about 4 MB of JSON text
  const cases: Array<[string, string, unknown, unknown]> = [
    ['quotes and backslashes', `k'ey "quoted" \\ back\\slash; DROP TABLE orders; --`, { s: quoting, [quoting]: 1 }, { s: `${quoting}!`, [quoting]: 1 }],
    ['unicode without \\u0000', 'unicode-key', { s: unicode, [unicode]: [unicode] }, { s: unicode, [unicode]: [`${unicode} `] }],
    ['a 4 MB body', 'huge-key', { s: huge }, { s: `${huge.slice(0, -1)}x` }],
  ];
  for (const route of ['/orders', '/payments']) {
    for (const [what, keyPart, body, changed] of cases) {
      test(`${route}: ${what}: replayed byte for byte; a changed body is 422`, async () => {
        const key = `${keyPart} ${route} ${randomUUID()}`.slice(0, 255);
        const first = await post(route, key, JSON.stringify(body));
        const firstBytes = Buffer.from(await first.arrayBuffer());
        assert.equal(first.status, 201, firstBytes.toString().slice(0, 200));
        assert.ok(firstBytes.toString('utf8').endsWith(JSON.stringify(body)), 'the handler saw the body as sent');
        const replay = await post(route, key, JSON.stringify(body));
        const replayBytes = Buffer.from(await replay.arrayBuffer());
        assert.equal(replay.status, 201);
        assert.equal(replay.headers.get('idempotent-replayed'), 'true');
        assert.ok(replayBytes.equals(firstBytes), 'byte-exact replay');
        assert.equal(replay.headers.get('content-type'), first.headers.get('content-type'));
        const mismatch = await post(route, key, JSON.stringify(changed));
        assert.equal(mismatch.status, 422);
      });
    }
  }

  test('the keys were stored as sent, and nothing else was written', async () => {
    const { rows } = await db.pool.query(
      "SELECT count(*)::int AS n FROM idem_keys WHERE key LIKE $1 AND state = 'succeeded'",
      [`k'ey "quoted" \\\\ back\\\\slash; DROP TABLE orders; --%`],
    );
    assert.equal(rows[0].n, 2);
    const orders = await db.pool.query('SELECT count(*)::int AS n FROM orders');
    assert.ok(orders.rows[0].n >= 1, 'the orders table is still there');
  });
});
