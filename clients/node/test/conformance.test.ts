/**
 * The shared conformance vectors (clients/conformance/vectors.json, format in its README), run
 * over real HTTP against an Express and a Fastify server built on the library, in each mode a
 * vector names, with the real PostgreSQL.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import express, { type NextFunction, type Request, type Response } from 'express';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { PoolClient } from 'pg';
import { httpFingerprint, httpScope, type HttpIdempotencyOptions } from '../src';
import { idempotent, keepRawBody } from '../src/express';
import { fastifyIdempotency } from '../src/fastify';
import { createTestDatabase, type TestDatabase } from './helpers';
import { send, type RawResponse } from './rawhttp';

type Mode = 'transaction' | 'lease';

interface Route {
  method: string;
  template: string;
  required?: boolean;
  public?: boolean;
  fingerprint_headers?: string[];
  keep_writes_on_error?: boolean;
  claim_safe_methods?: boolean;
  max_body_bytes?: number;
}

interface VectorRequest {
  method: string;
  target: string;
  headers: Array<[string, string]>;
  body_text?: string;
  body_base64?: string;
  body_repeat?: number;
  chunked?: boolean;
}

interface Expect {
  status?: number;
  replayed?: boolean;
  code?: string;
  retry_after?: boolean;
  same_body_as?: number;
  body_differs_from?: number;
  handler_runs?: number;
  committed_writes?: number;
  headers?: Array<[string, string]>;
}

interface Step {
  request?: VectorRequest;
  hold?: boolean;
  background?: boolean;
  release?: number;
  await?: number;
  expect?: Expect;
}

interface Vector {
  name: string;
  modes: Mode[];
  routes: Route[];
  steps: Step[];
}

interface FingerprintVector {
  name: string;
  method: string;
  target: string;
  content_type: string | null;
  fingerprint_headers: string[];
  headers: Array<[string, string]>;
  body_base64: string;
  sha256: string;
}

interface ScopeVector {
  name: string;
  method: string;
  route: string;
  tenant: string | null;
  caller: string | null;
  scope: string;
}

const file = path.join(__dirname, '..', '..', '..', 'conformance', 'vectors.json');
const { vectors, fingerprints, scopes } = JSON.parse(readFileSync(file, 'utf8')) as {
  vectors: Vector[];
  fingerprints: FingerprintVector[];
  scopes: ScopeVector[];
};

/** rawHeaders-style text of UTF-8 bytes, as Node's HTTP parser gives them (one character per byte). */
const latin1 = (text: string) => Buffer.from(text, 'utf8').toString('latin1');

describe('conformance: fingerprints', () => {
  for (const v of fingerprints) {
    test(v.name, () => {
      const rawHeaders = v.headers.flatMap(([name, value]) => [name, latin1(value)]);
      if (v.content_type !== null) rawHeaders.push('Content-Type', latin1(v.content_type));
      const digest = httpFingerprint({
        method: v.method,
        target: latin1(v.target),
        rawHeaders,
        fingerprintHeaders: v.fingerprint_headers,
        body: Buffer.from(v.body_base64, 'base64'),
      });
      assert.equal(digest.toString('hex'), v.sha256);
    });
  }
});

describe('conformance: scopes', () => {
  for (const v of scopes) {
    test(v.name, () => {
      assert.equal(httpScope({ method: v.method, route: v.route, tenant: v.tenant, caller: v.caller }), v.scope);
    });
  }
});

/** A one-shot barrier: the handler says it started, the runner lets it go on. */
class Hold {
  private enter!: () => void;
  private go!: () => void;
  readonly entered = new Promise<void>((resolve) => (this.enter = resolve));
  private readonly released = new Promise<void>((resolve) => (this.go = resolve));
  async wait(): Promise<void> {
    this.enter();
    await this.released;
  }
  release(): void {
    this.go();
  }
}

/** What the handler of every vector route does (the README's "test application"). */
class Harness {
  readonly runs = new Map<string, number>();
  private readonly holds = new Map<string, Hold>();

  constructor(private readonly db: TestDatabase) {}

  hold(vector: string): Hold {
    let hold = this.holds.get(vector);
    if (!hold) this.holds.set(vector, (hold = new Hold()));
    return hold;
  }

  async handle(vector: string, header: (name: string) => string | undefined, client: PoolClient | undefined) {
    const run = (this.runs.get(vector) ?? 0) + 1;
    this.runs.set(vector, run);
    if (header('x-test-hold') === '1') await this.hold(vector).wait();
    if (client) await client.query('INSERT INTO conformance_writes (vector) VALUES ($1)', [vector]);
    if (header('x-test-throw') === '1') throw new Error('the handler failed');
    const status = Number(header('x-test-status') ?? 201);
    const body = status === 204 || status === 304 ? undefined : JSON.stringify({ run, token: randomUUID() });
    return { status, location: `/things/${run}`, cacheControl: header('x-test-cache-control'), body };
  }

  async committedWrites(vector: string): Promise<number> {
    const { rows } = await this.db.pool.query('SELECT count(*)::int AS n FROM conformance_writes WHERE vector = $1', [vector]);
    return rows[0].n;
  }
}

/** The route's options; the caller is the Authorization header as is (the README's test application). */
function routeOptions<Req>(route: Route, mode: Mode, authorization: (req: Req) => string | undefined): HttpIdempotencyOptions<Req> {
  return {
    mode,
    required: route.required ?? false,
    ...(route.public ? { public: true } : { caller: (req: Req) => authorization(req) ?? null }),
    fingerprintHeaders: route.fingerprint_headers,
    keepWritesOnError: route.keep_writes_on_error,
    claimSafeMethods: route.claim_safe_methods,
    maxBodyBytes: route.max_body_bytes,
  };
}

type Mount = (prefix: string, route: Route, mode: Mode) => void;

interface Server {
  mount: Mount;
  start(): Promise<number>;
  close(): Promise<void>;
}

function expressServer(db: TestDatabase, harness: Harness): Server {
  const app = express();
  app.use(express.json({ verify: keepRawBody }));
  let close = async () => undefined as void;
  return {
    mount: (prefix, route, mode) => {
      const method = route.method.toLowerCase() as 'get' | 'post' | 'put' | 'patch' | 'delete';
      const options = routeOptions<Request>(route, mode, (req) => req.get('authorization'));
      app[method](`${prefix}${route.template}`, idempotent(db.store, options), async (req: Request, res: Response) => {
        const answer = await harness.handle(prefix, (name) => req.get(name), req.idempotency?.client);
        res.status(answer.status).set('Location', answer.location);
        if (answer.cacheControl !== undefined) res.set('Cache-Control', answer.cacheControl);
        if (answer.body === undefined) res.end();
        else res.type('application/json').send(answer.body);
      });
    },
    start: () =>
      new Promise((resolve) => {
        // the handler's thrown error: answered 500 without Express's default stack trace on stderr
        app.use((_err: unknown, _req: Request, res: Response, _next: NextFunction) => {
          res.status(500).json({ error: 'the handler failed' });
        });
        const server = app.listen(0, '127.0.0.1', () => {
          close = () => new Promise((done) => {
            server.closeAllConnections();
            server.close(() => done());
          });
          resolve((server.address() as AddressInfo).port);
        });
      }),
    close: () => close(),
  };
}

function fastifyServer(db: TestDatabase, harness: Harness): Server {
  const app: FastifyInstance = Fastify();
  // Fastify answers 415 for a content type without a parser; this one leaves the body unread,
  // as no parser would: the library reads it
  app.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined));
  const routes: Array<() => void> = [];
  return {
    mount: (prefix, route, mode) => {
      routes.push(() =>
        app.route({
          method: route.method as 'POST',
          url: `${prefix}${route.template}`,
          config: { idempotency: routeOptions<FastifyRequest>(route, mode, (request) => request.headers.authorization) },
          handler: async (request, reply) => {
            const answer = await harness.handle(prefix, (name) => request.headers[name] as string | undefined, request.idempotency?.client);
            reply.code(answer.status).header('location', answer.location);
            if (answer.cacheControl !== undefined) reply.header('cache-control', answer.cacheControl);
            if (answer.body === undefined) return reply.send();
            return reply.type('application/json').send(answer.body);
          },
        }),
      );
    },
    start: async () => {
      await app.register(fastifyIdempotency, { store: db.store });
      for (const add of routes) add();
      await app.listen({ port: 0, host: '127.0.0.1' });
      return (app.server.address() as AddressInfo).port;
    },
    close: () => app.close(),
  };
}

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase('conformance');
  await db.pool.query('CREATE TABLE conformance_writes (id bigserial PRIMARY KEY, vector text NOT NULL)');
});
after(async () => {
  await db.close();
});

for (const [framework, build] of [['express', expressServer], ['fastify', fastifyServer]] as const) {
  for (const mode of ['transaction', 'lease'] as const) {
    describe(`conformance: ${framework}, ${mode} mode`, () => {
      let harness: Harness;
      let server: Server;
      let port: number;
      const chosen = vectors.map((vector, index) => ({ vector, prefix: `/${framework}-${mode}-${index}` })).filter(({ vector }) => vector.modes.includes(mode));
      before(async () => {
        harness = new Harness(db);
        server = build(db, harness);
        for (const { vector, prefix } of chosen) for (const route of vector.routes) server.mount(prefix, route, mode);
        port = await server.start();
      });
      after(async () => {
        await server.close();
      });
      for (const { vector, prefix } of chosen) {
        test(vector.name, async () => {
          await runVector(vector, prefix, port, harness);
        });
      }
    });
  }
}

async function runVector(vector: Vector, prefix: string, port: number, harness: Harness): Promise<void> {
  const answers: Array<RawResponse | undefined> = [];
  const pending = new Map<number, Promise<RawResponse>>();
  for (const [index, step] of vector.steps.entries()) {
    const where = `${vector.name} step ${index}`;
    let answer: RawResponse | undefined;
    if (step.request) {
      const r = step.request;
      const once = r.body_base64 !== undefined ? Buffer.from(r.body_base64, 'base64') : r.body_text !== undefined ? Buffer.from(r.body_text, 'utf8') : undefined;
      const body = once === undefined || r.body_repeat === undefined ? once : Buffer.concat(Array.from({ length: r.body_repeat }, () => once));
      const sent = send(port, { method: r.method, target: `${prefix}${r.target}`, headers: r.headers, body, chunked: r.chunked });
      if (step.hold) {
        pending.set(index, sent);
        await harness.hold(prefix).entered;
      } else if (step.background) {
        pending.set(index, sent);
      } else {
        answer = await sent;
      }
    } else if (step.release !== undefined) {
      harness.hold(prefix).release();
      answer = await pending.get(step.release);
      answers[step.release] = answer;
    } else if (step.await !== undefined) {
      answer = await pending.get(step.await);
      answers[step.await] = answer;
    } else {
      throw new Error(`${where}: unknown step`);
    }
    answers[index] ??= answer;
    if (step.expect) {
      assert.ok(answer, `${where}: no answer`);
      await check(step.expect, answer, answers, harness, prefix, where);
    }
  }
}

async function check(e: Expect, answer: RawResponse, answers: Array<RawResponse | undefined>, harness: Harness, prefix: string, where: string) {
  const text = answer.body.toString('latin1').slice(0, 300);
  const header = (name: string) => answer.headers.get(name)?.[0];
  if (e.status !== undefined) assert.equal(answer.status, e.status, `${where}: status (body ${text})`);
  if (e.replayed !== undefined) assert.equal(header('idempotent-replayed'), e.replayed ? 'true' : undefined, `${where}: Idempotent-Replayed`);
  if (e.code !== undefined) {
    assert.match(header('content-type') ?? '', /^application\/problem\+json/, `${where}: content type`);
    const problem = JSON.parse(answer.body.toString('utf8')) as Record<string, unknown>;
    assert.equal(problem.code, e.code, `${where}: code`);
    assert.equal(problem.status, answer.status, `${where}: problem status`);
    assert.equal(problem.type, 'about:blank');
    assert.equal(typeof problem.title, 'string');
    assert.equal(typeof problem.detail, 'string');
  }
  if (e.retry_after !== undefined) {
    if (e.retry_after) assert.match(header('retry-after') ?? '', /^\d+$/, `${where}: Retry-After`);
    else assert.equal(header('retry-after'), undefined, `${where}: no Retry-After`);
  }
  if (e.same_body_as !== undefined) {
    const earlier = answers[e.same_body_as];
    assert.ok(earlier && earlier.body.equals(answer.body), `${where}: body equals step ${e.same_body_as}'s (${text})`);
  }
  if (e.body_differs_from !== undefined) {
    const earlier = answers[e.body_differs_from];
    assert.ok(earlier && !earlier.body.equals(answer.body), `${where}: body differs from step ${e.body_differs_from}'s`);
  }
  if (e.handler_runs !== undefined) assert.equal(harness.runs.get(prefix) ?? 0, e.handler_runs, `${where}: handler runs`);
  if (e.committed_writes !== undefined) assert.equal(await harness.committedWrites(prefix), e.committed_writes, `${where}: committed writes`);
  for (const [name, value] of e.headers ?? []) assert.equal(header(name.toLowerCase()), value, `${where}: header ${name}`);
}
