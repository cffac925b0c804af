import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { buildApp, listen } from './app';
import { createTestDatabase, eventually, Gates, isV12, leaseEnded, leaseOutlived, sqlEditionDifference, uniqueKey, type TestDatabase } from './helpers';

let db: TestDatabase;
let server: { url: string; close: () => Promise<void> };
const gates = new Gates();

before(async () => {
  db = await createTestDatabase('express');
  server = await listen(buildApp(db.store, { leaseMs: 1000, gates }));
});
after(async () => {
  await server.close();
  await db.close();
});

interface Extra {
  raw?: string;
  hangMs?: number;
  /** The handler waits until the test opens this gate. */
  hold?: string;
  fail?: 'retryable' | 'terminal';
}

function post(url: string, key: string | undefined, body: unknown, extra: Extra = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (extra.hangMs !== undefined) headers['x-hang-ms'] = String(extra.hangMs);
  if (extra.hold !== undefined) headers['x-hold'] = extra.hold;
  if (extra.fail !== undefined) headers['x-fail'] = extra.fail;
  if (key !== undefined) headers['idempotency-key'] = key;
  return fetch(url, { method: 'POST', headers, body: extra.raw ?? JSON.stringify(body) });
}

/** The key as the middleware stored it: its scope is the method and the route. */
function lookupIn(route: string, key: string) {
  return db.store.lookup(db.pool, { key, scope: `POST ${route}` });
}

async function countRows(table: string, key: string): Promise<number> {
  const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM ${table} WHERE idem_key = $1`, [key]);
  return rows[0].n;
}

describe('express: same-transaction mode', () => {
  test('64 concurrent identical requests: the handler runs once, the others get 409 or the replay', async () => {
    const key = uniqueKey('burst');
    const responses = await Promise.all(
      Array.from({ length: 64 }, () => post(`${server.url}/orders`, key, { item: 'book' })),
    );
    const bodies = await Promise.all(responses.map((r) => r.text()));
    const fresh = responses.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === null);
    const replays = responses.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === 'true');
    const busy = responses.filter((r) => r.status === 409);
    assert.equal(fresh.length, 1);
    assert.equal(replays.length + busy.length, 63);
    for (const r of busy) assert.ok(Number(r.headers.get('retry-after')) >= 1);
    const original = bodies[responses.indexOf(fresh[0])];
    for (const r of replays) assert.equal(bodies[responses.indexOf(r)], original);
    assert.equal(await countRows('orders', key), 1);
  });

  test('REPEATABLE READ: the duplicates\' 40001 is retried; none of 32 concurrent requests gets 503', async () => {
    const key = uniqueKey('burst-rr');
    const responses = await Promise.all(
      Array.from({ length: 32 }, () => post(`${server.url}/orders-rr`, key, { item: 'book' })),
    );
    const statuses = responses.map((r) => r.status);
    assert.ok(statuses.every((s) => s === 201 || s === 409), statuses.join(','));
    assert.equal(responses.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === null).length, 1);
    assert.ok(responses.some((r) => r.headers.get('idempotent-replayed') === 'true'), 'waiters replayed after their retry');
    assert.equal(await countRows('orders', key), 1);
  });

  test('byte-exact replay of status, chosen headers and body', async () => {
    const key = uniqueKey('exact');
    const first = await post(`${server.url}/orders`, key, { item: 'pen' });
    const firstBody = Buffer.from(await first.arrayBuffer());
    assert.equal(first.status, 201);
    const second = await post(`${server.url}/orders`, key, { item: 'pen' });
    const secondBody = Buffer.from(await second.arrayBuffer());
    assert.equal(second.status, 201);
    assert.equal(second.headers.get('idempotent-replayed'), 'true');
    assert.ok(firstBody.equals(secondBody), `${firstBody} vs ${secondBody}`);
    assert.match(firstBody.toString(), /^\{"z": 1, {2}"id": \d+/, 'key order and spacing kept');
    for (const name of ['content-type', 'location', 'x-order-token']) {
      assert.equal(second.headers.get(name), first.headers.get(name), name);
    }
    assert.notEqual(second.headers.get('x-not-replayed'), first.headers.get('x-not-replayed'));
    assert.equal(second.headers.get('x-not-replayed'), null);
    assert.equal(await countRows('orders', key), 1);
  });

  test('the fingerprint is the bytes: another key order or spacing is another request (422)', async () => {
    const key = uniqueKey('canon');
    const first = await post(`${server.url}/orders`, key, undefined, { raw: '{"item":"cup","qty":2}' });
    assert.equal(first.status, 201);
    const again = await post(`${server.url}/orders`, key, undefined, { raw: '{ "qty": 2, "item": "cup" }' });
    assert.equal(again.status, 422);
    assert.equal(await countRows('orders', key), 1);
  });

  test('changed body → 422; nothing runs', async () => {
    const key = uniqueKey('changed');
    assert.equal((await post(`${server.url}/orders`, key, { item: 'a' })).status, 201);
    const changed = await post(`${server.url}/orders`, key, { item: 'b' });
    assert.equal(changed.status, 422);
    assert.equal(changed.headers.get('content-type'), 'application/problem+json');
    assert.equal(await countRows('orders', key), 1);
  });

  test('missing key on a required route, bad keys → 400 before the database', async () => {
    assert.equal((await post(`${server.url}/orders`, undefined, { item: 'x' })).status, 400);
    for (const key of ['', 'x'.repeat(256), 'caf\u00e9']) {
      const headers = new Headers({ 'content-type': 'application/json' });
      headers.set('idempotency-key', key);
      const response = await fetch(`${server.url}/orders`, { method: 'POST', headers, body: '{"item":"x"}' }).catch(
        (e: unknown) => e,
      );
      // fetch itself refuses non-Latin-1 header values; the others reach the server and get 400
      if (response instanceof Response) assert.equal(response.status, 400, JSON.stringify(key));
    }
    // a repeated header, which Node would join into one value "a, b"
    const twice = await new Promise<number>((resolve, reject) => {
      const req = http.request(`${server.url}/orders`, { method: 'POST', headers: [
        'content-type', 'application/json', 'idempotency-key', 'twice-a', 'idempotency-key', 'twice-b'] }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.end('{"item":"x"}');
    });
    assert.equal(twice, 400);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM orders WHERE idem_key = '' OR length(idem_key) > 255 OR idem_key LIKE 'twice%'");
    assert.equal(rows[0].n, 0);
  });

  test('\\u0000 in a JSON body is fingerprinted as bytes: stored and replayed (the body never reaches jsonb)', async () => {
    const key = uniqueKey('nul');
    const response = await post(`${server.url}/orders`, key, undefined, { raw: '{"note":"a\\u0000b"}' });
    assert.equal(response.status, 201);
    const replay = await post(`${server.url}/orders`, key, undefined, { raw: '{"note":"a\\u0000b"}' });
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal((await lookupIn('/orders', key))?.state, 'succeeded');
  });

  test('an optional key: without it the request passes through untouched', async () => {
    const a = await (await post(`${server.url}/optional`, undefined, {})).json();
    const b = await (await post(`${server.url}/optional`, undefined, {})).json();
    assert.notDeepEqual(a, b);
    const key = uniqueKey('opt');
    const c = await (await post(`${server.url}/optional`, key, {})).text();
    const d = await (await post(`${server.url}/optional`, key, {})).text();
    assert.equal(c, d);
  });

  test('handler throws: retryable (500) rolls back everything; terminal (400) is stored and replayed', async () => {
    const retryable = uniqueKey('throw-retry');
    assert.equal((await post(`${server.url}/orders`, retryable, { item: 'x' }, { fail: 'retryable' })).status, 500);
    assert.equal(await lookupIn('/orders', retryable), null);
    assert.equal(await countRows('orders', retryable), 0);
    const later = await post(`${server.url}/orders`, retryable, { item: 'x' }, { fail: 'retryable' });
    assert.equal(later.status, 500);
    assert.equal(later.headers.get('idempotent-replayed'), null, 'the handler ran again');

    const terminal = uniqueKey('throw-terminal');
    const first = await post(`${server.url}/orders`, terminal, { item: 'x' }, { fail: 'terminal' });
    assert.equal(first.status, 400);
    const firstBody = await first.text();
    const replay = await post(`${server.url}/orders`, terminal, { item: 'x' }, { fail: 'terminal' });
    assert.equal(replay.status, 400);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(await replay.text(), firstBody);
    assert.equal((await lookupIn('/orders', terminal))?.state, 'failed');
  });
});

describe('express: lease mode', () => {
  test('a retry during the lease gets 409 + Retry-After; a retryable failure is taken over', async () => {
    const key = uniqueKey('lease-busy');
    // a minute's lease and a handler held until the duplicate has its answer: the duplicate
    // comes during both, however slow the machine
    const long = await listen(buildApp(db.store, { leaseMs: 60_000, gates }));
    try {
      const slow = post(`${long.url}/payments`, key, { amount: 5 }, { hold: key });
      await eventually(async () => (await lookupIn('/payments', key)) !== null, 'the claim');
      const busy = await post(`${long.url}/payments`, key, { amount: 5 });
      assert.equal(busy.status, 409);
      const retryAfter = Number(busy.headers.get('retry-after'));
      assert.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${retryAfter}: the lease's remainder`);
      gates.open(key);
      assert.equal((await slow).status, 201);
    } finally {
      await long.close();
    }

    const failing = uniqueKey('lease-fail');
    assert.equal((await post(`${server.url}/payments`, failing, { amount: 5 }, { fail: 'retryable' })).status, 500);
    assert.equal((await lookupIn('/payments', failing))?.retryable, true);
    const retried = await post(`${server.url}/payments`, failing, { amount: 5 });
    assert.equal(retried.status, 201);
    assert.equal(((await retried.json()) as { attempt: number }).attempt, 2);
  });

  test('a stale worker\'s completion is rejected: it answers 409, never success', async () => {
    const key = uniqueKey('lease-stale');
    const stale = post(`${server.url}/payments`, key, { amount: 7 }, { hold: key });
    await eventually(async () => (await lookupIn('/payments', key)) !== null, 'the first claim');
    // the 1 s lease ends (on the server's clock) while the first worker is held
    await eventually(() => leaseEnded(db.pool, key, 'POST /payments'), 'the end of the first lease');
    const fresh = await post(`${server.url}/payments`, key, { amount: 7 });
    assert.equal(fresh.status, 201);
    const freshBody = await fresh.text();
    gates.open(key); // the stale worker finishes only now
    const staleResponse = await stale;
    assert.equal(staleResponse.status, 409);
    const replay = await post(`${server.url}/payments`, key, { amount: 7 });
    assert.equal(await replay.text(), freshBody);
    assert.equal(await countRows('provider_charges', key), 1, 'the provider charged once');
  });

  test('heartbeat keeps a long job alive (1.2), or names version 1.2 (1.1)', async () => {
    const app = buildApp(db.store, { leaseMs: 3000, heartbeatMs: 200, gates });
    const local = await listen(app);
    try {
      const key = uniqueKey('lease-heartbeat');
      if (!isV12) {
        const response = await post(`${local.url}/payments`, key, { amount: 1 });
        assert.equal(response.status, 500);
        assert.equal(await lookupIn('/payments', key), null);
        return;
      }
      // the handler is held past the 3 s lease it claimed (the server's clock says when),
      // while the heartbeat moves the lease on: a duplicate then is still 409
      const job = post(`${local.url}/payments`, key, { amount: 1 }, { hold: key });
      await eventually(async () => (await lookupIn('/payments', key)) !== null, 'the claim');
      const claimedUntil = (await lookupIn('/payments', key))!.lockedUntil!;
      await eventually(() => leaseOutlived(db.pool, key, claimedUntil, 'POST /payments'), 'the lease to outlive its first end');
      assert.equal((await post(`${local.url}/payments`, key, { amount: 1 })).status, 409);
      gates.open(key);
      assert.equal((await job).status, 201);
      assert.equal(await countRows('effects', key), 1);
    } finally {
      await local.close();
    }
  });
});

describe('express: a duplicate that waits (1.2 wait)', { skip: !isV12 && 'wait needs extension 1.2' }, () => {
  let local: { url: string; close: () => Promise<void> };
  before(async () => {
    local = await listen(buildApp(db.store, { waitRoutes: true, gates }));
  });
  after(async () => {
    await local.close();
  });

  /** The first request's handler has written its row and holds the claim's transaction open. */
  async function handlerInTransaction(): Promise<boolean> {
    const { rows } = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'idle in transaction' AND query LIKE 'INSERT INTO orders%'`);
    return rows[0].n > 0;
  }

  /** A claim is running in the server (not ours): the duplicate waiting for the first's result. */
  async function claimWaits(): Promise<boolean> {
    const { rows } = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'active' AND query LIKE '%idem_claim(%' AND pid <> pg_backend_pid()`);
    return rows[0].n > 0;
  }

  for (const [mode, route, table] of [['lease', '/payments-wait', 'effects'], ['same-transaction', '/orders-wait', 'orders']] as const) {
    const skip = mode === 'lease' && sqlEditionDifference('nothing wakes a wait on a lease: the duplicate answers in_progress (409) at once');
    test(`${mode} mode: the second request gets the first's response once it finishes, not 409`, { skip }, async () => {
      const key = uniqueKey(`wait-${mode}`);
      const body = { item: 'kettle', amount: 9 };
      const first = post(`${local.url}${route}`, key, body, { hold: key });
      // the second starts while the first's handler is held: it must wait, not answer 409
      await eventually(async () => (mode === 'lease' ? (await lookupIn(route, key)) !== null : await handlerInTransaction()), 'the first claim');
      const waiting = post(`${local.url}${route}`, key, body);
      await eventually(claimWaits, 'the second claim to wait in the server');
      gates.open(key);
      const second = await waiting;
      const firstResponse = await first;
      assert.equal(firstResponse.status, 201);
      assert.equal(second.status, 201, `the waiting duplicate answered ${second.status}`);
      assert.equal(second.headers.get('idempotent-replayed'), 'true');
      assert.equal(firstResponse.headers.get('idempotent-replayed'), null);
      assert.equal(await second.text(), await firstResponse.text(), 'the replay is the first response, byte for byte');
      assert.equal(await countRows(table, key), 1, 'the handler ran once');
    });
  }
});

describe('express: upgrade', () => {
  test('a response stored under 1.1 replays byte for byte after ALTER EXTENSION UPDATE', { skip: !isV12 ? 'needs a newer version installed' : sqlEditionDifference('the plain route is no extension: no version 1.1, no ALTER EXTENSION UPDATE') }, async () => {
    const { IdempotencyStore } = await import('../src');
    const upgraded = await createTestDatabase('upgrade', '1.1');
    const old = upgraded.pool;
    const key = uniqueKey('upgrade');
    const before = await listen(buildApp(upgraded.store));
    const first = await post(`${before.url}/orders`, key, { item: 'mug' });
    const firstBody = await first.text();
    await before.close();
    await old.query('ALTER EXTENSION idempotency UPDATE');
    // a new store reads the new version (as an application restarted after the update would)
    const after = await listen(buildApp(new IdempotencyStore(old)));
    try {
      const replay = await post(`${after.url}/orders`, key, { item: 'mug' });
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(await replay.text(), firstBody);
      assert.equal(replay.headers.get('location'), first.headers.get('location'));
    } finally {
      await after.close();
      await upgraded.close();
    }
  });
});

describe('express: kill -9 of the application during the handler', () => {
  async function startApp(): Promise<{ child: ChildProcess; url: string; lines: string[] }> {
    const child = spawn(process.execPath, [path.join(__dirname, 'app.js')], {
      env: { ...process.env, PGDATABASE: db.name, LEASE_MS: '60000' },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const lines: string[] = [];
    let url = '';
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      for (const line of chunk.split('\n')) if (line) lines.push(line);
    });
    await eventually(async () => {
      const found = lines.find((l) => l.startsWith('listening '));
      if (found) url = found.slice('listening '.length);
      return url !== '';
    }, 'the application to listen');
    return { child, url, lines };
  }

  async function killDuringHandler(route: string, key: string, body: object) {
    const app = await startApp();
    const pending = post(`${app.url}${route}`, key, body, { hangMs: 60_000 }).catch((e: unknown) => e);
    await eventually(async () => app.lines.includes(`handling ${key}`), 'the handler to start');
    app.child.kill('SIGKILL');
    await once(app.child, 'exit');
    assert.ok((await pending) instanceof Error, 'the client saw the connection die');
  }

  test('same-transaction mode: the business row and the key vanish together; the retry runs once', async () => {
    const key = uniqueKey('kill-tx');
    await killDuringHandler('/orders', key, { item: 'lamp' });
    // the handler ran (its row was written in the claim's transaction); now both must be gone
    await eventually(async () => (await lookupIn('/orders', key)) === null, 'the rollback of the dead transaction');
    assert.equal(await countRows('orders', key), 0);
    const app = await startApp();
    try {
      const retry = await post(`${app.url}/orders`, key, { item: 'lamp' });
      assert.equal(retry.status, 201);
      const again = await post(`${app.url}/orders`, key, { item: 'lamp' });
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal(await countRows('orders', key), 1);
    } finally {
      app.child.kill('SIGKILL');
      await once(app.child, 'exit');
    }
  });

  test('lease mode: the retry gets 409 during the lease, takes over after it, one effect at the provider', async () => {
    const key = uniqueKey('kill-lease');
    await killDuringHandler('/payments', key, { amount: 3 });
    const app = await startApp();
    try {
      const row = await lookupIn('/payments', key);
      assert.equal(row?.state, 'pending');
      // the dead worker's minute-long lease still runs
      assert.equal((await post(`${app.url}/payments`, key, { amount: 3 })).status, 409);
      // then it runs out (moved to now on the server: a minute is not waited out)
      await db.pool.query("UPDATE idem_keys SET locked_until = clock_timestamp() WHERE scope = 'POST /payments' AND key = $1", [key]);
      await eventually(() => leaseEnded(db.pool, key, 'POST /payments'), 'the end of the lease');
      const retry = await post(`${app.url}/payments`, key, { amount: 3 });
      assert.equal(retry.status, 201);
      assert.equal(((await retry.json()) as { attempt: number }).attempt, 2);
      assert.equal(await countRows('provider_charges', key), 1, 'the provider charged once');
      const stale = await db.store.complete(db.pool, { key, scope: 'POST /payments', attempt: 1, response: { late: true } }).catch((e: unknown) => e);
      assert.equal((stale as { sqlstate?: string }).sqlstate, 'IK002', 'the dead attempt is fenced off');
    } finally {
      app.child.kill('SIGKILL');
      await once(app.child, 'exit');
    }
  });
});
