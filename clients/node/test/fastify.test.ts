import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import Fastify, { type FastifyInstance } from 'fastify';
import { fastifyIdempotency } from '../src/fastify';
import { createTestDatabase, eventually, Gates, uniqueKey, type TestDatabase } from './helpers';

let db: TestDatabase;
let app: FastifyInstance;
let url: string;
/** A request with `x-hold: NAME` is held in its handler until the test opens that gate. */
const gates = new Gates();

before(async () => {
  db = await createTestDatabase('fastify');
  app = Fastify();
  await app.register(fastifyIdempotency, { store: db.store, public: true, required: true, replayHeaders: ['content-type', 'location'] });
  app.post('/orders', { config: { idempotency: true } }, async (request, reply) => {
    const ctx = request.idempotency!;
    const { rows } = await ctx.client!.query('INSERT INTO orders (idem_key) VALUES ($1) RETURNING id', [ctx.key]);
    if (request.headers['x-fail'] === 'retryable') throw new Error('downstream unavailable');
    const hold = request.headers['x-hold'];
    if (typeof hold === 'string') await gates.wait(hold);
    reply.code(201).header('location', `/orders/${rows[0].id}`).type('application/json');
    return `{"b": 2, "a": ${rows[0].id},  "token": "${randomUUID()}"}`;
  });
  app.post('/payments', { config: { idempotency: { mode: 'lease', lease: 60_000, heartbeatMs: false } } }, async (request, reply) => {
    const ctx = request.idempotency!;
    await db.pool.query('INSERT INTO effects (idem_key, attempt) VALUES ($1, $2)', [ctx.key, ctx.attempt]);
    if (request.headers['x-fail'] === 'retryable') throw new Error('provider down');
    reply.code(201);
    return { attempt: ctx.attempt, token: randomUUID() };
  });
  app.post('/plain', async () => ({ token: randomUUID() }));
  url = await app.listen({ port: 0, host: '127.0.0.1' });
});
after(async () => {
  await app.close();
  await db.close();
});

function post(path: string, key: string | undefined, body: string, headers: Record<string, string> = {}) {
  const all: Record<string, string> = { 'content-type': 'application/json', ...headers };
  if (key !== undefined) all['idempotency-key'] = key;
  return fetch(`${url}${path}`, { method: 'POST', headers: all, body });
}

async function count(table: string, key: string): Promise<number> {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${table} WHERE idem_key = $1`, [key]);
  return rows[0].n;
}

describe('fastify plugin', () => {
  test('64 concurrent identical requests: the handler runs once, the others get 409 or the replay', async () => {
    const key = uniqueKey('f-burst');
    const responses = await Promise.all(Array.from({ length: 64 }, () => post('/orders', key, '{"item":"x"}')));
    const bodies = await Promise.all(responses.map((r) => r.text()));
    const fresh = responses.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === null);
    assert.equal(fresh.length, 1);
    const original = bodies[responses.indexOf(fresh[0])];
    for (const [i, r] of responses.entries()) {
      if (r === fresh[0]) continue;
      assert.ok(r.status === 409 || (r.status === 201 && r.headers.get('idempotent-replayed') === 'true'), String(r.status));
      if (r.status === 201) assert.equal(bodies[i], original);
    }
    assert.equal(await count('orders', key), 1);
  });

  test('byte-exact replay of status, chosen headers and body', async () => {
    const key = uniqueKey('f-exact');
    const first = await post('/orders', key, '{"item":"y"}');
    const firstBody = Buffer.from(await first.arrayBuffer());
    const second = await post('/orders', key, '{"item":"y"}');
    assert.equal(second.status, 201);
    assert.equal(second.headers.get('idempotent-replayed'), 'true');
    assert.ok(firstBody.equals(Buffer.from(await second.arrayBuffer())));
    assert.match(firstBody.toString(), /^\{"b": 2, "a": \d+, {2}"token"/);
    assert.equal(second.headers.get('location'), first.headers.get('location'));
    assert.equal(second.headers.get('content-type'), first.headers.get('content-type'));
  });

  test('changed body → 422, bad or missing key → 400, \\u0000 stored; routes without config untouched', async () => {
    const key = uniqueKey('f-422');
    assert.equal((await post('/orders', key, '{"item":"a"}')).status, 201);
    assert.equal((await post('/orders', key, '{"item":"b"}')).status, 422);
    assert.equal((await post('/orders', undefined, '{"item":"a"}')).status, 400);
    assert.equal((await post('/orders', 'x'.repeat(300), '{"item":"a"}')).status, 400);
    const nulKey = uniqueKey('f-nul');
    assert.equal((await post('/orders', nulKey, '{"item":"\\u0000"}')).status, 201);
    assert.equal((await db.store.lookup(db.pool, { key: nulKey, scope: 'POST /orders' }))?.state, 'succeeded');
    assert.equal((await post('/plain', undefined, '{}')).status, 200);
    assert.equal(await count('orders', key), 1);
    assert.equal(await count('orders', nulKey), 1);
  });

  test('handler throws: same-transaction rolls back; lease mode records a retryable failure', async () => {
    const key = uniqueKey('f-throw');
    assert.equal((await post('/orders', key, '{"item":"z"}', { 'x-fail': 'retryable' })).status, 500);
    assert.equal(await count('orders', key), 0);
    assert.equal(await db.store.lookup(db.pool, { key, scope: 'POST /orders' }), null);
    assert.equal((await post('/orders', key, '{"item":"z"}')).status, 201);

    const lease = uniqueKey('f-lease-throw');
    assert.equal((await post('/payments', lease, '{"amount":1}', { 'x-fail': 'retryable' })).status, 500);
    const row = await db.store.lookup(db.pool, { key: lease, scope: 'POST /payments' });
    assert.equal(row?.state, 'failed');
    assert.equal(row?.retryable, true);
    const retry = await post('/payments', lease, '{"amount":1}');
    assert.equal(retry.status, 201);
    assert.equal(((await retry.json()) as { attempt: number }).attempt, 2);
    assert.equal(await count('effects', lease), 2, 'the retry ran the handler again');
  });

  test('a client that disconnects mid-handler: the work finishes and is stored; its retry replays', async () => {
    const key = uniqueKey('f-abort');
    const controller = new AbortController();
    const pending = fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-hold': key },
      body: '{"item":"q"}',
      signal: controller.signal,
    });
    await eventually(async () => gates.arrived(key), 'the handler to run');
    controller.abort();
    await assert.rejects(pending);
    gates.open(key); // the handler finishes after its client has gone
    await eventually(async () => (await db.store.lookup(db.pool, { key, scope: 'POST /orders' }))?.state === 'succeeded', 'the stored result');
    const retry = await post('/orders', key, '{"item":"q"}');
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get('idempotent-replayed'), 'true');
    assert.equal(await count('orders', key), 1);
  });
});
