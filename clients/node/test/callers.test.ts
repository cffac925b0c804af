/**
 * Keys belong to a caller, bodies are bounded, safe methods pass through (docs/http.md), tested as
 * a hostile client would try them, against real Express and Fastify servers and the real database.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import { after, before, describe, test } from 'node:test';
import express, { type NextFunction, type Request, type Response } from 'express';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { Pool } from 'pg';
import { IdempotencyStore } from '../src';
import { idempotent, keepRawBody } from '../src/express';
import { fastifyIdempotency } from '../src/fastify';
import { createTestDatabase, uniqueKey, type TestDatabase } from './helpers';
import { send } from './rawhttp';

let db: TestDatabase;
/** A store whose database cannot be reached: any call to it would be answered 503. */
let unreachable: IdempotencyStore;
const servers: Array<() => Promise<void>> = [];

/** Bearer tokens of the test's users: the principal is the user id behind the token. */
const users: Record<string, { id: string; name: string }> = {
  'token-alice': { id: 'u-1001', name: 'alice' },
  'token-mallory': { id: 'u-6666', name: 'mallory' },
};
type Authenticated = { user?: { id: string; name: string } };

function authenticate(header: string | undefined) {
  const token = header?.startsWith('Bearer ') ? header.slice('Bearer '.length) : undefined;
  return token === undefined ? undefined : users[token];
}

async function expressApp(store: IdempotencyStore): Promise<number> {
  const app = express();
  app.use((req: Request, _res: Response, next: NextFunction) => {
    (req as Request & Authenticated).user = authenticate(req.get('authorization'));
    next();
  });
  app.use(express.json({ verify: keepRawBody }));
  const caller = (req: Request) => (req as Request & Authenticated).user?.id;
  const answer = (req: Request, res: Response) => {
    const who = (req as Request & Authenticated).user?.name ?? 'nobody';
    res.status(201).json({ for: who, secret: `${who}-${randomUUID()}` });
  };
  app.post('/orders', idempotent(store, { caller, required: true }), answer);
  app.post('/small', idempotent(store, { caller, maxBodyBytes: 1024 }), (req, res) => {
    if (req.idempotency) return answer(req, res);
    // no key: the library read nothing, so the handler still has the whole stream
    let size = 0;
    req.on('data', (chunk: Buffer) => (size += chunk.length));
    req.on('end', () => res.status(200).json({ read: size }));
  });
  app.get('/orders', idempotent(store, { caller, required: true }), (_req, res) => {
    res.status(200).json({ token: randomUUID() });
  });
  app.post('/fingerprinted', idempotent(store, { caller, fingerprintHeaders: ['x-region'] }), answer);
  app.post('/bad-caller', idempotent(store, { caller: () => 42 as unknown as string }), answer);
  app.use((_err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    res.status(500).json({ error: 'failed' });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  servers.push(() => new Promise((done) => {
    server.closeAllConnections();
    server.close(() => done());
  }));
  return (server.address() as AddressInfo).port;
}

async function fastifyApp(store: IdempotencyStore): Promise<number> {
  const app: FastifyInstance = Fastify();
  app.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined));
  app.decorateRequest('user', undefined);
  app.addHook('onRequest', async (request) => {
    (request as FastifyRequest & Authenticated).user = authenticate(request.headers.authorization);
  });
  const caller = (request: FastifyRequest) => (request as FastifyRequest & Authenticated).user?.id;
  // the plugin names the caller for every route; a route may opt out
  await app.register(fastifyIdempotency, { store, caller });
  const answer = async (request: FastifyRequest) => {
    const who = (request as FastifyRequest & Authenticated).user?.name ?? 'nobody';
    return { for: who, secret: `${who}-${randomUUID()}` };
  };
  app.post('/orders', { config: { idempotency: { required: true } } }, async (request, reply) => reply.code(201).send(await answer(request)));
  app.post('/small', { config: { idempotency: { maxBodyBytes: 1024 } } }, async (request, reply) => {
    if (request.idempotency) return reply.code(201).send(await answer(request));
    return reply.code(200).send({ read: null });
  });
  app.get('/orders', { config: { idempotency: { required: true } } }, async () => ({ token: randomUUID() }));
  app.post('/fingerprinted', { config: { idempotency: { fingerprintHeaders: ['x-region'] } } }, async (request, reply) => reply.code(201).send(await answer(request)));
  app.post('/webhook', { config: { idempotency: { public: true, required: true } } }, async (request, reply) => reply.code(201).send(await answer(request)));
  await app.listen({ port: 0, host: '127.0.0.1' });
  servers.push(() => app.close());
  return (app.server.address() as AddressInfo).port;
}

before(async () => {
  db = await createTestDatabase('callers');
  // nothing listens on this socket directory: a claim would fail and be answered 503
  unreachable = new IdempotencyStore(new Pool({ host: '/nonexistent', max: 1, connectionTimeoutMillis: 2000 }));
});
after(async () => {
  for (const close of servers) await close();
  await unreachable.pool.end();
  await db.close();
});

const json = (body: Buffer) => JSON.parse(body.toString('utf8')) as Record<string, unknown>;

function request(port: number, method: string, path: string, headers: Array<[string, string]>, body?: string) {
  return send(port, {
    method,
    target: path,
    headers: body === undefined ? headers : [...headers, ['Content-Type', 'application/json']],
    body: body === undefined ? undefined : Buffer.from(body),
  });
}

describe('mounting a route without saying who the caller is', () => {
  test('Express: idempotent() without caller or public, or with both, throws a TypeError that says what to write', () => {
    const store = db.store;
    for (const options of [{}, { required: true }, { public: false }]) {
      assert.throws(() => idempotent(store, options), (err: unknown) => {
        assert.ok(err instanceof TypeError);
        assert.match(err.message, /caller: \(req\) => req\.user\.id/);
        assert.match(err.message, /public: true/);
        assert.match(err.message, /Keys belong to a caller/);
        return true;
      });
    }
    assert.throws(() => idempotent(store, { caller: () => 'x', public: true }), TypeError);
    assert.throws(() => idempotent(store, undefined as never), TypeError);
    assert.throws(() => idempotent(store, { public: true, maxBodyBytes: -1 }), TypeError);
    assert.doesNotThrow(() => idempotent(store, { public: true }));
  });

  test('Fastify: a route without caller or public is refused when it is declared', async () => {
    const app = Fastify();
    await app.register(fastifyIdempotency, { store: db.store });
    assert.throws(() => app.post('/x', { config: { idempotency: true } }, async () => ({})), (err: unknown) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /say who the caller is/);
      return true;
    });
    assert.throws(() => app.post('/y', { config: { idempotency: { caller: () => 'a', public: true } } }, async () => ({})), TypeError);
    // a route may name its caller, or opt out over the plugin's caller
    app.post('/z', { config: { idempotency: { caller: () => 'a' } } }, async () => ({}));
    await app.close();
    const withCaller = Fastify();
    await withCaller.register(fastifyIdempotency, { store: db.store, caller: () => 'a' });
    withCaller.post('/hook', { config: { idempotency: { public: true } } }, async () => ({}));
    withCaller.post('/orders', { config: { idempotency: true } }, async () => ({}));
    await withCaller.close();
  });
});

for (const [framework, build] of [['express', expressApp], ['fastify', fastifyApp]] as const) {
  describe(`${framework}: two callers, one key`, () => {
    let port: number;
    let offline: number;
    before(async () => {
      port = await build(db.store);
      offline = await build(unreachable);
    });

    test('mallory replays alice\'s key and body: her own fresh answer, never alice\'s; the database holds no user id', async () => {
      const key = uniqueKey('stolen');
      const body = '{"item":"book"}';
      const alice = await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-alice'], ['Idempotency-Key', key]], body);
      assert.equal(alice.status, 201);
      assert.equal(json(alice.body).for, 'alice');
      const mallory = await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-mallory'], ['Idempotency-Key', key]], body);
      assert.equal(mallory.status, 201);
      assert.equal(mallory.headers.get('idempotent-replayed'), undefined);
      assert.equal(json(mallory.body).for, 'mallory');
      assert.doesNotMatch(mallory.body.toString(), /alice/);
      // another body under alice's key: no 422 that would tell mallory the key exists
      const probe = await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-mallory'], ['Idempotency-Key', key]], '{"item":"other"}');
      assert.equal(probe.status, 422, 'mallory\'s own key, now used with another body');
      const other = uniqueKey('probe');
      await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-alice'], ['Idempotency-Key', other]], body);
      const probeOther = await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-mallory'], ['Idempotency-Key', other]], '{"x":1}');
      assert.equal(probeOther.status, 201);
      assert.equal(json(probeOther.body).for, 'mallory');
      // alice's retry still gets alice's answer
      const retry = await request(port, 'POST', '/orders', [['Authorization', 'Bearer token-alice'], ['Idempotency-Key', key]], body);
      assert.equal(retry.headers.get('idempotent-replayed')?.[0], 'true');
      assert.ok(retry.body.equals(alice.body));
      const { rows } = await db.pool.query('SELECT scope FROM idem_keys WHERE key = $1 ORDER BY scope', [key]);
      assert.equal(rows.length, 2);
      for (const { scope } of rows) {
        assert.match(scope, /^POST \/orders caller:[0-9a-f]{64}$/);
        assert.doesNotMatch(scope, /u-1001|u-6666|alice|mallory/);
      }
    });

    test('a keyed request without a principal: 401, handler not run, no database call', async () => {
      // the store cannot reach its database: a claim would be 503, so 401 means none was tried
      const anonymous = await request(offline, 'POST', '/orders', [['Idempotency-Key', uniqueKey('anon')]], '{}');
      assert.equal(anonymous.status, 401);
      assert.equal(json(anonymous.body).code, 'idempotency_caller_unknown');
      const forged = await request(offline, 'POST', '/orders', [['Authorization', 'Bearer forged'], ['Idempotency-Key', uniqueKey('anon')]], '{}');
      assert.equal(forged.status, 401);
      // the same request from a principal does reach the (unreachable) database
      const known = await request(offline, 'POST', '/orders', [['Authorization', 'Bearer token-alice'], ['Idempotency-Key', uniqueKey('anon')]], '{}');
      assert.ok(known.status >= 500, `status ${known.status}`);
    });

    test('safe methods pass through without the database, whatever the key header says', async () => {
      for (const key of [uniqueKey('get'), 'not a key', undefined]) {
        const headers: Array<[string, string]> = [['Authorization', 'Bearer token-alice']];
        if (key !== undefined) headers.push(['Idempotency-Key', key]);
        const answer = await request(offline, 'GET', '/orders', headers);
        assert.equal(answer.status, 200, String(key));
        assert.equal(answer.headers.get('idempotent-replayed'), undefined);
      }
    });

    test('a repeated fingerprint header is one value, lines joined by ", "', async () => {
      const key = uniqueKey('joined');
      const alice: [string, string] = ['Authorization', 'Bearer token-alice'];
      const first = await request(port, 'POST', '/fingerprinted', [alice, ['Idempotency-Key', key], ['X-Region', 'eu'], ['X-Region', 'us']], '{}');
      assert.equal(first.status, 201);
      const joined = await request(port, 'POST', '/fingerprinted', [alice, ['Idempotency-Key', key], ['X-Region', 'eu, us']], '{}');
      assert.equal(joined.headers.get('idempotent-replayed')?.[0], 'true');
      for (const other of [[['X-Region', 'eu,us']], [['X-Region', 'us'], ['X-Region', 'eu']], [['X-Region', 'us']]] as Array<Array<[string, string]>>) {
        const answer = await request(port, 'POST', '/fingerprinted', [alice, ['Idempotency-Key', key], ...other], '{}');
        assert.equal(answer.status, 422, JSON.stringify(other));
      }
    });

    test('a repeated Content-Type is every line joined by ", ", not the line the framework kept', async () => {
      const key = uniqueKey('ctype');
      const alice: [string, string] = ['Authorization', 'Bearer token-alice'];
      const body = Buffer.from('abc');
      const twice = await send(port, { method: 'POST', target: '/fingerprinted', headers: [alice, ['Idempotency-Key', key], ['Content-Type', 'text/plain'], ['Content-Type', 'charset=x']], body });
      assert.equal(twice.status, 201);
      // both frameworks keep only the first line ("text/plain"); the fingerprint has both
      const first = await send(port, { method: 'POST', target: '/fingerprinted', headers: [alice, ['Idempotency-Key', key], ['Content-Type', 'text/plain']], body });
      assert.equal(first.status, 422);
      if (framework === 'express') {
        // (Fastify answers 415 to this value before any hook: it is no media type)
        const once = await send(port, { method: 'POST', target: '/fingerprinted', headers: [alice, ['Idempotency-Key', key], ['Content-Type', 'text/plain, charset=x']], body });
        assert.equal(once.headers.get('idempotent-replayed')?.[0], 'true');
      }
    });
  });

  describe(`${framework}: bounded bodies`, () => {
    let port: number;
    let offline: number;
    before(async () => {
      port = await build(db.store);
      offline = await build(unreachable);
    });
    const alice: [string, string] = ['Authorization', 'Bearer token-alice'];

    for (const chunked of [false, true]) {
      test(`a 50 MB keyed body (${chunked ? 'chunked' : 'Content-Length'}): 413 with memory bounded, nothing stored`, async () => {
        const key = uniqueKey('huge');
        const size = 50 * 1024 * 1024;
        const sent = await sendHuge(port, '/small', [alice, ['Idempotency-Key', key], ['Content-Type', 'application/octet-stream']], size, chunked);
        const growthMiB = sent.heldBytes / (1024 * 1024);
        assert.equal(sent.status, 413);
        assert.equal(json(sent.body).code, 'idempotency_body_too_large');
        assert.equal(sent.written, size, 'the client sent the whole body and then read the answer');
        // a server that kept the body would hold up to 50 MB of it
        assert.ok(growthMiB < MEMORY_BOUND_MIB, `${growthMiB.toFixed(1)} MiB of buffers were held while the body streamed`);
        const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM idem_keys WHERE key = $1', [key]);
        assert.equal(rows[0].n, 0);
      });
    }

    test('413 is answered without the database, and the same key works with a smaller body', async () => {
      const key = uniqueKey('limit');
      const big = await send(offline, { method: 'POST', target: '/small', headers: [alice, ['Idempotency-Key', key], ['Content-Type', 'application/octet-stream']], body: Buffer.alloc(1025, 0x61) });
      assert.equal(big.status, 413);
      const fits = await send(port, { method: 'POST', target: '/small', headers: [alice, ['Idempotency-Key', key], ['Content-Type', 'application/octet-stream']], body: Buffer.alloc(1024, 0x61), chunked: true });
      assert.equal(fits.status, 201);
    });

    if (framework === 'express') {
      test('without a key the library reads nothing: the handler reads the whole body itself', async () => {
        const size = 300 * 1024;
        const answer = await send(offline, { method: 'POST', target: '/small', headers: [alice, ['Content-Type', 'application/octet-stream']], body: Buffer.alloc(size, 0x62), chunked: true });
        assert.equal(answer.status, 200);
        assert.equal(json(answer.body).read, size);
      });

      test('a caller hook that returns no string is a setup error: 500, nothing stored', async () => {
        const key = uniqueKey('bad-caller');
        const answer = await request(port, 'POST', '/bad-caller', [alice, ['Idempotency-Key', key]], '{}');
        assert.equal(answer.status, 500);
        const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM idem_keys WHERE key = $1', [key]);
        assert.equal(rows[0].n, 0);
      });
    } else {
      test('a public route: any client with the key gets the stored answer', async () => {
        const key = uniqueKey('webhook');
        const first = await request(port, 'POST', '/webhook', [alice, ['Idempotency-Key', key]], '{"event":1}');
        assert.equal(first.status, 201);
        const anyone = await request(port, 'POST', '/webhook', [['Idempotency-Key', key]], '{"event":1}');
        assert.equal(anyone.headers.get('idempotent-replayed')?.[0], 'true');
        assert.ok(anyone.body.equals(first.body));
        const { rows } = await db.pool.query('SELECT scope FROM idem_keys WHERE key = $1', [key]);
        assert.deepEqual(rows.map((r) => r.scope), ['POST /webhook']);
      });
    }
  });
}

/** Buffer memory (MiB) the process may hold while a 50 MB body is refused (client and server are this process). */
const MEMORY_BOUND_MIB = 16;

// collecting garbage as the body streams leaves only the buffers something still holds: their
// total is then an exact measure of what is kept, where the RSS depends on when V8 collects and
// on what the allocator gives back
v8.setFlagsFromString('--expose-gc');
const collectGarbage = runInNewContext('gc') as () => void;

function liveBufferBytes(): number {
  collectGarbage();
  return process.memoryUsage().arrayBuffers;
}

/**
 * Sends a body of `size` bytes in 64 KiB writes (one reused buffer, waiting for the socket to
 * drain: the client holds almost nothing), then reads the answer. `heldBytes`: the most buffer
 * memory held, above what was held before, at any 4 MiB step of the body.
 */
function sendHuge(port: number, path: string, headers: Array<[string, string]>, size: number, chunked: boolean) {
  return new Promise<{ status: number; body: Buffer; written: number; heldBytes: number }>((resolve, reject) => {
    const base = liveBufferBytes();
    let heldBytes = 0;
    const socket = net.connect(port, '127.0.0.1');
    const received: Buffer[] = [];
    let written = 0;
    socket.on('data', (chunk) => received.push(chunk));
    socket.on('error', reject);
    socket.on('end', () => {
      const data = Buffer.concat(received);
      const end = data.indexOf('\r\n\r\n');
      const head = data.subarray(0, end).toString('latin1');
      let body = data.subarray(end + 4);
      if (/\r\ntransfer-encoding: chunked/i.test(head)) body = body.subarray(body.indexOf('\r\n') + 2, body.lastIndexOf('}') + 1);
      resolve({ status: Number(head.split(' ')[1]), body, written, heldBytes });
    });
    socket.on('connect', async () => {
      const head = [`POST ${path} HTTP/1.1`, `Host: 127.0.0.1:${port}`, ...headers.map(([n, v]) => `${n}: ${v}`)];
      head.push(chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${size}`, 'Connection: close', '', '');
      socket.write(head.join('\r\n'));
      const piece = Buffer.alloc(64 * 1024, 0x78);
      const framed = chunked ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]) : piece;
      while (written < size) {
        written += piece.length;
        if (!socket.write(framed)) await new Promise((resolve) => socket.once('drain', resolve));
        if (written % (4 * 1024 * 1024) === 0) heldBytes = Math.max(heldBytes, liveBufferBytes() - base);
      }
      if (chunked) socket.write('0\r\n\r\n');
    });
  });
}
