import { Readable } from 'node:stream';
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
import {
  BodyTooLargeError,
  HttpIdempotency,
  readLimited,
  toHeaderRecord,
  type HttpIdempotencyOptions,
  type HttpResponse,
  type IdempotencyContext,
  type Session,
} from './http';
import { contentLength } from './request';
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
 * sent. Register it before the routes. A keyed request's body is read here (preParsing, up to
 * `maxBodyBytes`) and handed on to whatever content type parser runs; other requests' bodies are
 * not touched. Each route must say who its caller is (`caller`, here or in the route's options)
 * or opt out (`public: true`): a route that says neither is refused with a TypeError.
 */
export const fastifyIdempotency: FastifyPluginAsync<FastifyIdempotencyOptions> = async (
  fastify: FastifyInstance,
  { store, tenant, ...defaults },
) => {
  const sessions = new WeakMap<FastifyRequest, Session>();
  const bodies = new WeakMap<FastifyRequest, Buffer>();

  fastify.addHook('onRoute', (route) => {
    const config = (route.config as { idempotency?: boolean | HttpIdempotencyOptions<FastifyRequest> } | undefined)?.idempotency;
    if (!config) return;
    const http = new HttpIdempotency<FastifyRequest>(store, config === true ? defaults : routeOptions(defaults, config));
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (methods.length !== 1) throw new Error(`idempotency: route ${route.url} must have one method (its scope)`);
    const scopeRoute = route.url;

    // the bytes are read before the parser (Fastify's own bodyLimit is larger) and handed on to it
    const preParsing: preParsingHookHandler = async (request, reply, payload) => {
      if (!http.readsBody(request.method, request.raw.rawHeaders)) return payload;
      const length = contentLength(request.raw.rawHeaders);
      if (length !== undefined && length > http.maxBodyBytes) return sendResponse(reply, http.bodyTooLarge());
      let body: Buffer;
      try {
        body = await readLimited(payload, http.maxBodyBytes);
      } catch (err) {
        if (err instanceof BodyTooLargeError) return sendResponse(reply, http.bodyTooLarge());
        throw err;
      }
      bodies.set(request, body);
      const replay = Readable.from(body.length === 0 ? [] : [body], { objectMode: false });
      // what Fastify compares with Content-Length: the bytes as they came (before any decoding)
      (replay as Readable & { receivedEncodedLength?: number }).receivedEncodedLength = body.length;
      return replay;
    };
    const preHandler: preHandlerHookHandler = async (request, reply) => {
      const decision = await http.begin({
        request,
        method: request.method,
        target: request.originalUrl,
        route: scopeRoute,
        tenant: tenant?.(request),
        rawHeaders: request.raw.rawHeaders,
        readBody: async () => bodies.get(request) ?? Buffer.alloc(0),
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

/**
 * A route's options over the plugin's: a route that names its caller, or opts out, replaces the
 * plugin's choice of the other (both in one options object is still refused).
 */
function routeOptions(
  defaults: HttpIdempotencyOptions<FastifyRequest>,
  route: HttpIdempotencyOptions<FastifyRequest>,
): HttpIdempotencyOptions<FastifyRequest> {
  const merged = { ...defaults, ...route };
  if (route.public === true && route.caller === undefined) delete merged.caller;
  if (route.caller !== undefined && route.public === undefined) delete merged.public;
  return merged;
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
