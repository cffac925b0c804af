import { Transform, type TransformCallback } from 'node:stream';
import type {
  FastifyInstance,
  FastifyPluginAsync,
  FastifyReply,
  FastifyRequest,
  onResponseHookHandler,
  onSendHookHandler,
  preHandlerHookHandler,
  preParsingHookHandler,
} from 'fastify';
import { HttpIdempotency, toHeaderRecord, type HttpIdempotencyOptions, type HttpResponse, type IdempotencyContext, type Session } from './http';
import type { IdempotencyStore } from './store';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set when this request claimed its key. */
    idempotency?: IdempotencyContext;
  }
  interface FastifyContextConfig {
    /** Turn idempotency on for this route (true: the plugin's defaults). */
    idempotency?: boolean | HttpIdempotencyOptions<FastifyRequest>;
  }
}

export interface FastifyIdempotencyOptions extends HttpIdempotencyOptions<FastifyRequest> {
  store: IdempotencyStore;
  /** Tenant of the request: part of the scope. */
  tenant?: (request: FastifyRequest) => string | undefined;
}

/**
 * Fastify plugin: routes with `config: { idempotency: true | {...options} }` get the key checks,
 * the claim before the handler, and the response stored (and committed) in onSend before it is
 * sent. Register it before the routes. The body's bytes are kept as they stream to the content
 * type parser (preParsing), whatever the parser; a body no parser reads is read here.
 */
export const fastifyIdempotency: FastifyPluginAsync<FastifyIdempotencyOptions> = async (
  fastify: FastifyInstance,
  { store, tenant, ...defaults },
) => {
  const sessions = new WeakMap<FastifyRequest, Session>();
  const bodies = new WeakMap<FastifyRequest, RecordingStream>();

  fastify.addHook('onRoute', (route) => {
    const config = (route.config as { idempotency?: boolean | HttpIdempotencyOptions<FastifyRequest> } | undefined)?.idempotency;
    if (!config) return;
    const http = new HttpIdempotency<FastifyRequest>(store, config === true ? defaults : { ...defaults, ...config });
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (methods.length !== 1) throw new Error(`idempotency: route ${route.url} must have one method (its scope)`);
    const scopeRoute = route.url;

    const preParsing: preParsingHookHandler = async (request, _reply, payload) => {
      const recording = new RecordingStream();
      payload.on('error', (err) => recording.destroy(err));
      bodies.set(request, recording);
      return payload.pipe(recording);
    };
    const preHandler: preHandlerHookHandler = async (request, reply) => {
      const decision = await http.begin({
        request,
        method: request.method,
        target: request.originalUrl,
        route: scopeRoute,
        tenant: tenant?.(request),
        rawHeaders: request.raw.rawHeaders,
        readBody: () => bodies.get(request)?.bytes() ?? Promise.resolve(Buffer.alloc(0)),
      });
      if (decision.kind === 'pass') return;
      if (decision.kind === 'respond') return sendResponse(reply, decision.response);
      sessions.set(request, decision.session);
      request.idempotency = decision.session.context;
    };
    const onSend: onSendHookHandler<unknown> = async (request, reply, payload) => {
      const session = sessions.get(request);
      if (!session) return payload;
      sessions.delete(request);
      const captured: HttpResponse = {
        status: reply.statusCode,
        headers: toHeaderRecord(reply.getHeaders()),
        body: await toBuffer(payload),
      };
      const response = await session.finish(captured);
      if (response === captured) return captured.body;
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      reply.code(response.status).headers(response.headers);
      return response.body;
    };
    // a client that goes away does not stop the handler (it may still use the transaction's
    // client): its result is stored for the retry. Only an exchange that ended without onSend
    // reaching us (another hook failed) is given back here.
    const giveBack: onResponseHookHandler = async (request) => {
      const session = sessions.get(request);
      if (!session) return;
      sessions.delete(request);
      await session.abandon();
    };
    route.preParsing = [...toArray(route.preParsing), preParsing];
    route.preHandler = [...toArray(route.preHandler), preHandler];
    route.onSend = [...toArray(route.onSend), onSend];
    route.onResponse = [...toArray(route.onResponse), giveBack];
  });
};
// hooks apply to the routes of the instance that registers the plugin, not only inside it
(fastifyIdempotency as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true;

/** Passes the body on to the parser and keeps a copy of its bytes. */
class RecordingStream extends Transform {
  private readonly chunks: Buffer[] = [];

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.chunks.push(chunk);
    callback(null, chunk);
  }

  /** All the bytes; what no parser read is read now (and dropped after being kept). */
  async bytes(): Promise<Buffer> {
    if (!this.readableEnded) {
      for await (const chunk of this) void chunk;
    }
    return Buffer.concat(this.chunks);
  }
}

function sendResponse(reply: FastifyReply, response: HttpResponse): FastifyReply {
  return reply.code(response.status).headers(response.headers).send(response.body);
}

function toArray<T>(value: T | T[] | undefined): T[] {
  if (value === undefined) return [];
  return Array.isArray(value) ? value : [value];
}

async function toBuffer(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload);
  const chunks: Buffer[] = [];
  for await (const chunk of payload as AsyncIterable<Buffer | string>) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}
