/**
 * The parts of docs/http.md that the shared vectors cannot express in Node terms: the raw body
 * when a parser kept none, the validate and onCommitted hooks, and a lease taken over while the
 * handler runs (heartbeats on by default).
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import express, { type Request } from 'express';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { HttpResponse } from '../src';
import { idempotent, keepRawBody } from '../src/express';
import { fastifyIdempotency } from '../src/fastify';
import { createTestDatabase, isV12, uniqueKey, type TestDatabase } from './helpers';

let db: TestDatabase;
let expressUrl: string;
let closeExpress: () => Promise<void>;
let fastify: FastifyInstance;
let fastifyUrl: string;
const errors: unknown[] = [];
const committed: Array<{ key: string; state: string | undefined; status: number }> = [];
/** Lease-mode handlers wait here until the test has taken their key over. */
const takenOver = new Map<string, () => void>();

async function stateOf(key: string, scope: string) {
  return (await db.store.lookup(db.pool, { key, scope }))?.state;
}

const validate = (body: unknown) =>
  typeof (body as { amount?: unknown } | undefined)?.amount === 'number'
    ? undefined
    : { status: 400, body: { error: 'amount must be a number' } };

before(async () => {
  db = await createTestDatabase('hooks');
  const app = express();
  // no verify hook: the JSON parser keeps no bytes
  app.post('/no-raw', express.json(), idempotent(db.store, { public: true, required: true }), (_req, res) => {
    res.status(201).json({ ok: true });
  });
  app.use(express.json({ verify: keepRawBody }));
  const onCommitted = async (req: Request, response: HttpResponse) => {
    const key = req.idempotency!.key;
    committed.push({ key, state: await stateOf(key, `POST ${req.route.path}`), status: response.status });
    if (req.get('x-fail-hook') === '1') throw new Error('the hook failed');
  };
  app.post(
    '/validated',
    idempotent(db.store, { public: true, required: true, validate: (req) => validate(req.body), onCommitted, onError: (err) => errors.push(err) }),
    (_req, res) => {
      res.status(201).json({ ok: true });
    },
  );
  app.post(
    '/lease-validated',
    idempotent(db.store, { public: true, mode: 'lease', required: true, validate: (req) => validate(req.body), onCommitted }),
    (_req, res) => {
      res.status(201).json({ ok: true });
    },
  );
  app.post(
    '/stale',
    idempotent(db.store, { public: true, mode: 'lease', required: true, lease: 30_000, heartbeatMs: 20 }),
    async (req, res) => {
      const { key, signal } = req.idempotency!;
      takenOver.get(key)?.();
      if (!signal.aborted) await once(signal, 'abort');
      res.status(201).json({ done: true });
    },
  );
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  expressUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  closeExpress = () => new Promise((done) => {
    server.closeAllConnections();
    server.close(() => done());
  });

  fastify = Fastify();
  await fastify.register(fastifyIdempotency, { store: db.store, public: true, required: true });
  fastify.post(
    '/validated',
    {
      config: {
        idempotency: {
          validate: (request: FastifyRequest) => validate(request.body),
          onCommitted: async (request: FastifyRequest, response: HttpResponse) => {
            const key = request.idempotency!.key;
            committed.push({ key, state: await stateOf(key, 'POST /validated'), status: response.status });
          },
        },
      },
    },
    async (_request, reply) => reply.code(201).send({ ok: true }),
  );
  fastifyUrl = await fastify.listen({ port: 0, host: '127.0.0.1' });
});
after(async () => {
  await closeExpress();
  await fastify.close();
  await db.close();
});

function post(url: string, key: string, body: string, headers: Record<string, string> = {}) {
  return fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers }, body });
}

describe('the raw body', () => {
  test('a parser that kept no bytes: 500 idempotency_raw_body_unavailable, nothing claimed', async () => {
    const key = uniqueKey('no-raw');
    const response = await post(`${expressUrl}/no-raw`, key, '{"a": 1}');
    assert.equal(response.status, 500);
    assert.equal(((await response.json()) as { code: string }).code, 'idempotency_raw_body_unavailable');
    assert.equal(await db.store.lookup(db.pool, { key, scope: 'POST /no-raw' }), null);
  });
});

describe('validate', () => {
  for (const [name, url, scope] of [
    ['express', () => `${expressUrl}/validated`, 'POST /validated'],
    ['express lease mode', () => `${expressUrl}/lease-validated`, 'POST /lease-validated'],
    ['fastify', () => `${fastifyUrl}/validated`, 'POST /validated'],
  ] as const) {
    test(`${name}: its answer is sent, nothing is stored; the fixed request with the same key runs`, async () => {
      const key = uniqueKey(`validate-${name.replace(/ /g, '-')}`);
      const refused = await post(url(), key, '{"amount": "x"}');
      assert.equal(refused.status, 400);
      assert.deepEqual(await refused.json(), { error: 'amount must be a number' });
      assert.equal(await db.store.lookup(db.pool, { key, scope }), null);
      const fixed = await post(url(), key, '{"amount": 5}');
      assert.equal(fixed.status, 201);
      assert.equal(fixed.headers.get('idempotent-replayed'), null);
    });
  }
});

describe('onCommitted', () => {
  for (const [name, url] of [
    ['express', () => `${expressUrl}/validated`],
    ['express lease mode', () => `${expressUrl}/lease-validated`],
    ['fastify', () => `${fastifyUrl}/validated`],
  ] as const) {
    test(`${name}: runs after the commit, before the answer; not for a replay`, async () => {
      const key = uniqueKey(`committed-${name.replace(/ /g, '-')}`);
      const response = await post(url(), key, '{"amount": 1}');
      assert.equal(response.status, 201);
      // the answer arrived: the hook has run, and saw the key committed from another connection
      assert.deepEqual(committed.filter((c) => c.key === key), [{ key, state: 'succeeded', status: 201 }]);
      const replay = await post(url(), key, '{"amount": 1}');
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(committed.filter((c) => c.key === key).length, 1);
    });
  }

  test('a failing hook is reported and changes nothing stored or sent', async () => {
    const key = uniqueKey('hook-fails');
    const before = errors.length;
    const response = await post(`${expressUrl}/validated`, key, '{"amount": 1}', { 'x-fail-hook': '1' });
    assert.equal(response.status, 201);
    assert.equal(errors.length, before + 1);
    assert.match(String(errors[before]), /the hook failed/);
    assert.equal(await stateOf(key, 'POST /validated'), 'succeeded');
  });
});

describe('lease mode: a key taken over while the handler runs', () => {
  test('the heartbeat aborts the signal; the answer is 409 idempotency_attempt_stale and nothing is stored', { skip: !isV12 && 'heartbeats need idem_extend (1.2 or later)' }, async () => {
    const key = uniqueKey('stale');
    const started = new Promise<void>((resolve) => takenOver.set(key, resolve));
    const pending = post(`${expressUrl}/stale`, key, '{}');
    await started;
    // what a takeover leaves behind: a newer attempt owns the key
    await db.pool.query("UPDATE idem_keys SET attempt = attempt + 1 WHERE key = $1 AND scope = 'POST /stale'", [key]);
    const response = await pending;
    assert.equal(response.status, 409);
    assert.equal(((await response.json()) as { code: string }).code, 'idempotency_attempt_stale');
    const row = await db.store.lookup(db.pool, { key, scope: 'POST /stale' });
    assert.equal(row?.state, 'pending');
    assert.equal(row?.attempt, 2);
  });
});
