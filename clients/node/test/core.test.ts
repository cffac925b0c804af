import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Client, Pool } from 'pg';
import {
  IdempotencyStore,
  InvalidArgumentError,
  KeyMismatchError,
  KeyNotFoundError,
  KeyNotPendingError,
  OpenTransactionError,
  PartitionUnavailableError,
  ReadOnlyError,
  RowSecurityNotInForceError,
  ScopeMovedError,
  StaleAttemptError,
  TransientError,
  UnsupportedVersionError,
  runInTransaction,
  runWithLease,
  translateError,
} from '../src';
import { createTestDatabase, edition, eventually, extensionVersion, isV12, leaseEnded, leaseOutlived, sqlEditionDifference, uniqueKey, type TestDatabase } from './helpers';

let db: TestDatabase;
before(async () => {
  db = await createTestDatabase('core');
});
after(async () => {
  await db.close();
});

describe('store', () => {
  test('reads the installed version and the extension schema', async () => {
    assert.equal(await db.store.version(), extensionVersion);
    assert.equal(await db.store.supportsV12(), isV12);
  });

  test('the edition under test answers (IDEMPOTENCY_EDITION)', async () => {
    const { rows } = await db.pool.query(`SELECT to_regproc('idem_edition') IS NOT NULL AS has`);
    if (edition === 'c' && extensionVersion === '1.1') {
      assert.equal(rows[0].has, false, 'idem_edition() is new in 1.6');
    } else {
      assert.equal((await db.pool.query('SELECT idem_edition() AS e')).rows[0].e, edition);
    }
  });

  test('claim, complete, replay: typed columns read as a row', async () => {
    const key = uniqueKey('typed');
    const first = await db.store.claim(db.pool, { key, request: { amount: 100, items: [1, 2] }, scope: 'POST /x' });
    assert.equal(first.outcome, 'claimed');
    assert.equal(first.inserted, true);
    assert.equal(first.attempt, 1);
    assert.equal(first.state, 'pending');
    assert.ok(first.expiresAt instanceof Date);
    const row = await db.store.complete(db.pool, { key, scope: 'POST /x', response: { ok: [1, 2] }, responseCode: 201, attempt: 1 });
    assert.equal(row.state, 'succeeded');
    assert.equal(row.responseCode, 201);
    const again = await db.store.claim(db.pool, { key, request: { items: [1, 2], amount: 100 }, scope: 'POST /x' });
    assert.equal(again.outcome, 'replay');
    assert.equal(again.inserted, false);
    assert.deepEqual(again.response, { ok: [1, 2] });
    assert.equal(again.responseCode, 201);
    assert.equal(again.state, 'succeeded');
  });

  test('in_progress carries retry_after in milliseconds and whole seconds', async () => {
    const key = uniqueKey('busy');
    await db.store.claim(db.pool, { key, lease: 30_000 });
    const busy = await db.store.claim(db.pool, { key });
    assert.equal(busy.outcome, 'in_progress');
    assert.ok(busy.retryAfterMs! > 0 && busy.retryAfterMs! <= 30_000);
    assert.ok(busy.retryAfterSeconds! >= 1 && busy.retryAfterSeconds! <= 30);
    assert.equal(busy.attempt, 1);
  });

  test('lookup gives null for a missing key, the row otherwise', async () => {
    const key = uniqueKey('lookup');
    assert.equal(await db.store.lookup(db.pool, { key }), null);
    await db.store.claim(db.pool, { key });
    const row = await db.store.lookup(db.pool, { key });
    assert.equal(row?.state, 'pending');
    assert.equal(row?.attempt, 1);
  });
});

describe('typed errors', () => {
  test('IK900 and IK901 (the scale-out proxy) → transient 503 errors', () => {
    const moved = translateError(Object.assign(new Error('scope "s" belongs to partition 1 of 4, not to partition 0'), { code: 'IK900' }));
    assert.ok(moved instanceof ScopeMovedError && moved instanceof TransientError);
    assert.equal(moved.httpStatus, 503);
    const down = translateError(Object.assign(new Error('partition 2 of 4 is unavailable'), { code: 'IK901' }));
    assert.ok(down instanceof PartitionUnavailableError && down instanceof TransientError);
    assert.equal(down.httpStatus, 503);
  });

  test('IK006 (1.5): tenant policies recorded but not in force → RowSecurityNotInForceError (503)', { skip: Number(extensionVersion) < 1.5 ? 'needs extension 1.5' : sqlEditionDifference('no row-security record (idem_row_security, IK006)') }, async () => {
    const role = `node_tenant_${process.pid}`;
    const schema = (await db.pool.query(`SELECT extnamespace::regnamespace::text AS s FROM pg_extension WHERE extname = 'idempotency'`)).rows[0].s;
    await db.pool.query(`CREATE ROLE ${role}; GRANT USAGE ON SCHEMA ${schema} TO ${role}; GRANT SELECT, INSERT, UPDATE ON ${schema}.idem_keys TO ${role}`);
    // the record says row-level security is on while the table has none: what a restore that
    // could not apply it leaves (written without applying it: no trigger fires in replica mode,
    // as in a data-only restore with --disable-triggers)
    await db.pool.query(`BEGIN; SET LOCAL session_replication_role = replica;
      INSERT INTO ${schema}.idem_row_security (enabled, forced) VALUES (true, false); COMMIT`);
    const tenant = new Client({ database: db.name });
    await tenant.connect();
    try {
      await tenant.query(`SET ROLE ${role}`);
      const err = await db.store.claim(tenant, { key: uniqueKey('rls') }).catch((e: unknown) => e);
      assert.ok(err instanceof RowSecurityNotInForceError, String(err));
      assert.equal(err.sqlstate, 'IK006');
      assert.equal(err.httpStatus, 503);
    } finally {
      await tenant.end();
      await db.pool.query(`BEGIN; SET LOCAL session_replication_role = replica; DELETE FROM ${schema}.idem_row_security; COMMIT`);
      await db.pool.query(`DROP OWNED BY ${role}; DROP ROLE ${role}`);
    }
  });

  test('IK001 mismatch → KeyMismatchError (422)', async () => {
    const key = uniqueKey('mismatch');
    await db.store.claim(db.pool, { key, request: { a: 1 } });
    const err = await db.store.claim(db.pool, { key, request: { a: 2 } }).catch((e: unknown) => e);
    assert.ok(err instanceof KeyMismatchError);
    assert.equal(err.sqlstate, 'IK001');
    assert.equal(err.httpStatus, 422);
  });

  test('a batch call names the key it failed on (1.3 batches)', { skip: Number(extensionVersion) < 1.3 ? 'batches need extension 1.3' : false }, async () => {
    const [ok, bad, fresh] = [uniqueKey('batch-a'), uniqueKey('batch-b'), uniqueKey('batch-c')];
    await db.pool.query(`SELECT count(*) FROM idem_claim_batch($1, requests => $2::jsonb[])`, [[ok, bad], ['{"n": 1}', '{"n": 2}']]);
    const mismatch = translateError(
      await db.pool
        .query(`SELECT * FROM idem_claim_batch($1, requests => $2::jsonb[])`, [[fresh, ok, bad], ['{}', '{"n": 1}', '{"n": 3}']])
        .catch((e: unknown) => e),
    );
    assert.ok(mismatch instanceof KeyMismatchError);
    assert.equal(mismatch.key, bad);
    const missing = translateError(
      await db.pool.query(`SELECT idem_complete_batch($1)`, [[ok, fresh]]).catch((e: unknown) => e),
    );
    assert.ok(missing instanceof KeyNotFoundError);
    assert.equal(missing.key, fresh);
    // nothing of either failed call was written: the first key is still pending
    const { rows } = await db.pool.query(`SELECT key, state FROM idem_keys WHERE key = ANY($1) ORDER BY key`, [[ok, bad, fresh]]);
    assert.deepEqual(rows.map((r) => [r.key, r.state]), [[ok, 'pending'], [bad, 'pending']]);
    // errors of single calls name the key in their message only
    const single = await db.store.claim(db.pool, { key: bad, request: { n: 4 } }).catch((e: unknown) => e);
    assert.ok(single instanceof KeyMismatchError);
    assert.equal(single.key, undefined);
  });

  test('IK002 stale attempt, IK003 not found, IK004 not pending', async () => {
    const key = uniqueKey('fence');
    await db.store.claim(db.pool, { key, lease: 1 });
    await eventually(() => leaseEnded(db.pool, key), 'the end of the 1 ms lease');
    const takeover = await db.store.claim(db.pool, { key, lease: 60_000 });
    assert.equal(takeover.attempt, 2);
    const stale = await db.store.complete(db.pool, { key, attempt: 1, response: {} }).catch((e: unknown) => e);
    assert.ok(stale instanceof StaleAttemptError);
    assert.equal(stale.sqlstate, 'IK002');
    await db.store.complete(db.pool, { key, attempt: 2, response: {} });
    const done = await db.store.fail(db.pool, { key, attempt: 2 }).catch((e: unknown) => e);
    assert.ok(done instanceof KeyNotPendingError);
    assert.equal(done.sqlstate, 'IK004');
    const missing = await db.store.complete(db.pool, { key: uniqueKey('none'), response: {} }).catch((e: unknown) => e);
    assert.ok(missing instanceof KeyNotFoundError);
    assert.equal(missing.httpStatus, 404);
  });

  test('22023, 22004, 22P02, 22P05 → InvalidArgumentError (400), nothing written', async () => {
    const bad = await db.store.claim(db.pool, { key: 'tab\there' }).catch((e: unknown) => e);
    assert.ok(bad instanceof InvalidArgumentError);
    assert.equal(bad.sqlstate, '22023');
    assert.match(bad.message, /"key"/);
    const pendingKey = uniqueKey('n');
    await db.store.claim(db.pool, { key: pendingKey });
    // 1.1: idem_complete needs a response; 1.2: idem_extend needs an attempt
    const nullArgument = await (isV12
      ? db.store.extend(db.pool, { key: pendingKey, attempt: null as unknown as number, lease: 1000 })
      : db.store.complete(db.pool, { key: pendingKey })
    ).catch((e: unknown) => e);
    assert.ok(nullArgument instanceof InvalidArgumentError, String(nullArgument));
    assert.equal(nullArgument.sqlstate, '22004');
    assert.equal((await db.store.lookup(db.pool, { key: pendingKey }))?.state, 'pending');
    const badInterval = await db.store.claim(db.pool, { key: uniqueKey('i'), lease: 'soon' }).catch((e: unknown) => e);
    assert.ok(badInterval instanceof Error);
    const nul = await db.store.claim(db.pool, { key: uniqueKey('nul'), request: { a: 'x\u0000y' } }).catch((e: unknown) => e);
    assert.ok(nul instanceof InvalidArgumentError);
    assert.equal(nul.sqlstate, '22P05');
    const surrogate = await db.store.claim(db.pool, { key: uniqueKey('sur'), request: { a: '\ud800' } }).catch((e: unknown) => e);
    assert.ok(surrogate instanceof InvalidArgumentError);
    assert.equal(surrogate.sqlstate, '22P02');
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idem_keys WHERE key LIKE 'nul-%' OR key LIKE 'sur-%'");
    assert.equal(rows[0].n, 0);
  });

  test('25006 in a read-only transaction → ReadOnlyError (503)', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN READ ONLY');
      const err = await db.store.claim(client, { key: uniqueKey('ro') }).catch((e: unknown) => e);
      assert.ok(err instanceof ReadOnlyError);
      assert.equal(err.httpStatus, 503);
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });

  test('40001 under REPEATABLE READ → TransientError', async () => {
    const key = uniqueKey('rr');
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await client.query('SELECT 1'); // take the snapshot
      await db.store.claim(db.pool, { key }); // committed after the snapshot
      const err = await db.store.claim(client, { key }).catch((e: unknown) => e);
      assert.ok(err instanceof TransientError);
      assert.equal(err.sqlstate, '40001');
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });

  test('55P03 lock_timeout and 57014 statement_timeout while waiting → TransientError', async () => {
    const key = uniqueKey('lock');
    const owner = await db.pool.connect();
    const waiter = await db.pool.connect();
    try {
      await owner.query('BEGIN');
      await db.store.claim(owner, { key });
      for (const [setting, sqlstate] of [
        ['lock_timeout', '55P03'],
        ['statement_timeout', '57014'],
      ] as const) {
        await waiter.query('BEGIN');
        await waiter.query(`SET LOCAL ${setting} = '100ms'`);
        const err = await db.store.claim(waiter, { key }).catch((e: unknown) => e);
        await waiter.query('ROLLBACK');
        assert.ok(err instanceof TransientError, `${setting}: ${String(err)}`);
        assert.equal(err.sqlstate, sqlstate);
      }
    } finally {
      await owner.query('ROLLBACK');
      owner.release();
      waiter.release();
    }
  });

  test('40P01 deadlock between two same-transaction claims → TransientError', async () => {
    const [a, b] = [uniqueKey('dl-a'), uniqueKey('dl-b')];
    const one = await db.pool.connect();
    const two = await db.pool.connect();
    try {
      await one.query('BEGIN');
      await two.query('BEGIN');
      await db.store.claim(one, { key: a });
      await db.store.claim(two, { key: b });
      const results = await Promise.allSettled([db.store.claim(one, { key: b }), db.store.claim(two, { key: a })]);
      const rejected = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
      assert.equal(rejected.length, 1);
      assert.ok(rejected[0].reason instanceof TransientError);
      assert.equal(rejected[0].reason.sqlstate, '40P01');
    } finally {
      await one.query('ROLLBACK');
      await two.query('ROLLBACK');
      one.release();
      two.release();
    }
  });
});

describe('beginAndClaim: BEGIN and the claim in one exchange', () => {
  test('errors at each step leave the connection usable and its prepared statement known', async () => {
    // a fresh connection each time: the first claim on it also prepares the statement
    for (const failure of ['bind', 'execute'] as const) {
      const client = new Client({ database: db.name });
      await client.connect();
      try {
        const key = uniqueKey(`bc-${failure}`);
        if (failure === 'execute') await db.store.claim(db.pool, { key, request: { a: 1 } });
        // bind: the interval text is refused while binding, after the statement was parsed;
        // execute: the claim itself refuses the changed request (IK001)
        const options = failure === 'bind' ? { key, ttl: 'soon' } : { key, request: { a: 2 } };
        const err = await db.store.beginAndClaim(client as never, options).catch((e: unknown) => e);
        assert.ok(err instanceof Error, String(err));
        if (failure === 'execute') assert.ok(err instanceof KeyMismatchError);
        const aborted = await client.query('SELECT 1').catch((e: unknown) => e);
        assert.equal((aborted as { code?: string }).code, '25P02', 'the transaction is open and aborted');
        await client.query('ROLLBACK');
        const ok = await db.store.beginAndClaim(client as never, { key: `${key}-2`, request: { a: 1 } }, 'REPEATABLE READ');
        assert.equal(ok.outcome, 'claimed');
        assert.equal(client.getTransactionStatus(), 'T', 'the claim\'s transaction stays open');
        const { rows } = await client.query('SHOW transaction_isolation');
        assert.equal(rows[0].transaction_isolation, 'repeatable read');
        await client.query('COMMIT');
        assert.equal((await db.store.lookup(db.pool, { key: `${key}-2` }))?.state, 'pending');
      } finally {
        await client.end();
      }
    }
  });

  test('a pipelining pg client (pipeline: true) gets BEGIN and the claim pipelined instead', async () => {
    const client = new Client({ database: db.name, pipeline: true } as never);
    await client.connect();
    try {
      const key = uniqueKey('bc-pipeline');
      const claimed = await db.store.beginAndClaim(client as never, { key, request: { a: 1 } });
      assert.equal(claimed.outcome, 'claimed');
      assert.equal(client.getTransactionStatus(), 'T');
      await client.query('ROLLBACK');
      assert.equal(await db.store.lookup(db.pool, { key }), null);
    } finally {
      await client.end();
    }
  });
});

describe('runInTransaction', () => {
  test('the handler runs once; the business row and the key commit together', async () => {
    const key = uniqueKey('tx');
    let runs = 0;
    const handler = async (client: import('pg').PoolClient) => {
      runs++;
      const { rows } = await client.query('INSERT INTO orders (idem_key) VALUES ($1) RETURNING id', [key]);
      return { response: { orderId: Number(rows[0].id) }, responseCode: 201 };
    };
    const first = await runInTransaction(db.store, { key, request: { n: 1 } }, handler);
    assert.equal(first.outcome, 'executed');
    const second = await runInTransaction(db.store, { key, request: { n: 1 } }, handler);
    assert.equal(second.outcome, 'replay');
    assert.equal(runs, 1);
    if (first.outcome === 'executed' && second.outcome === 'replay') {
      assert.deepEqual(second.claim.response, first.result.response);
    }
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM orders WHERE idem_key = $1', [key]);
    assert.equal(rows[0].n, 1);
  });

  test('a thrown error rolls back the row and the key (retryable by default)', async () => {
    const key = uniqueKey('tx-throw');
    await assert.rejects(
      runInTransaction(db.store, { key }, async (client) => {
        await client.query('INSERT INTO orders (idem_key) VALUES ($1)', [key]);
        throw new Error('boom');
      }),
      /boom/,
    );
    assert.equal(await db.store.lookup(db.pool, { key }), null);
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM orders WHERE idem_key = $1', [key]);
    assert.equal(rows[0].n, 0);
    const retry = await runInTransaction(db.store, { key }, async () => ({ response: { ok: true } }));
    assert.equal(retry.outcome, 'executed');
  });

  test('a terminal failure by policy is stored and replayed', async () => {
    const key = uniqueKey('tx-terminal');
    const onFailure = () => ({ retryable: false, response: { error: 'declined' }, responseCode: 402 });
    await assert.rejects(runInTransaction(db.store, { key, onFailure }, async () => { throw new Error('declined'); }));
    const replay = await runInTransaction(db.store, { key, onFailure }, async () => ({ response: {} }));
    assert.equal(replay.outcome, 'replay');
    if (replay.outcome === 'replay') {
      assert.equal(replay.claim.state, 'failed');
      assert.equal(replay.claim.responseCode, 402);
      assert.deepEqual(replay.claim.response, { error: 'declined' });
    }
  });

  test('40001 is retried a bounded number of times', async () => {
    await db.pool.query("INSERT INTO orders (id, idem_key) VALUES (-1, 'shared') ON CONFLICT (id) DO NOTHING");
    const key2 = uniqueKey('tx-40001b');
    let attempts = 0;
    const outcome = await runInTransaction(db.store, { key: key2, isolationLevel: 'REPEATABLE READ', maxRetries: 2 }, async (client) => {
      attempts++;
      if (attempts === 1) {
        // a concurrent committed write of a row this transaction also writes: a real 40001
        await client.query('SELECT count(*) FROM orders');
        await db.pool.query('UPDATE orders SET idem_key = $1 WHERE id = -1', [key2]);
        await client.query('UPDATE orders SET item = $1 WHERE id = -1', ['x']);
      }
      return { response: { attempts } };
    });
    assert.equal(outcome.outcome, 'executed');
    assert.equal(attempts, 2);
    let always = 0;
    await assert.rejects(
      runInTransaction(db.store, { key: uniqueKey('tx-40001c'), isolationLevel: 'REPEATABLE READ', maxRetries: 2 }, async (client) => {
        always++;
        await client.query('SELECT count(*) FROM orders');
        await db.pool.query('UPDATE orders SET item = $1 WHERE id = -1', [String(always)]);
        await client.query('UPDATE orders SET item = $1 WHERE id = -1', ['y']);
        return {};
      }),
      (err: unknown) => err instanceof TransientError && err.sqlstate === '40001',
    );
    assert.equal(always, 3);
  });
});

describe('runWithLease', () => {
  test('refuses a client inside an open transaction', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('BEGIN');
      await assert.rejects(
        runWithLease(db.store, { key: uniqueKey('open'), lease: 1000, client }, async () => ({})),
        OpenTransactionError,
      );
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });

  test('a stale worker gets StaleAttemptError, never success; the new owner wins', async () => {
    const key = uniqueKey('lease-stale');
    const stale = runWithLease(db.store, { key, lease: 200, heartbeatMs: false }, async ({ attempt }) => {
      await eventually(async () => (await db.store.lookup(db.pool, { key }))?.attempt === 2, 'the takeover');
      return { response: { by: attempt } };
    });
    // the stale worker may fail before the new owner's run returns: its rejection is handled now
    const staleRejected = assert.rejects(stale, StaleAttemptError);
    // the stale worker has claimed, and its lease has ended on the server's clock
    await eventually(async () => (await db.store.lookup(db.pool, { key })) !== null, 'the first claim');
    await eventually(() => leaseEnded(db.pool, key), 'the end of the first lease');
    const fresh = await runWithLease(db.store, { key, lease: 60_000, heartbeatMs: false }, async ({ attempt }) => ({
      response: { by: attempt },
    }));
    assert.equal(fresh.outcome, 'executed');
    await staleRejected;
    const row = await db.store.lookup(db.pool, { key });
    assert.deepEqual(row?.response, { by: 2 });
  });

  test('a thrown error records a retryable failure; the next claim takes over', async () => {
    const key = uniqueKey('lease-throw');
    await assert.rejects(runWithLease(db.store, { key, lease: 60_000 }, async () => { throw new Error('provider down'); }));
    const row = await db.store.lookup(db.pool, { key });
    assert.equal(row?.state, 'failed');
    assert.equal(row?.retryable, true);
    const retry = await runWithLease(db.store, { key, lease: 60_000 }, async ({ attempt }) => ({ response: { attempt } }));
    assert.equal(retry.outcome, 'executed');
    if (retry.outcome === 'executed') assert.equal(retry.attempt, 2);
  });

  test('heartbeat keeps a long job alive (1.2); on 1.1 asking for it names version 1.2', async () => {
    const key = uniqueKey('heartbeat');
    if (!isV12) {
      const err = await runWithLease(db.store, { key, lease: 500, heartbeatMs: 100 }, async () => ({})).catch((e: unknown) => e);
      assert.ok(err instanceof UnsupportedVersionError);
      assert.match(err.message, /version 1\.2/);
      assert.equal(await db.store.lookup(db.pool, { key }), null, 'nothing was claimed');
      return;
    }
    let finishJob!: () => void;
    const jobMayFinish = new Promise<void>((resolve) => (finishJob = resolve));
    const job = runWithLease(db.store, { key, lease: 3000, heartbeatMs: 300 }, async ({ signal }) => {
      await jobMayFinish;
      return { response: { aborted: signal.aborted } };
    });
    // the job outlives the lease it claimed (the server's clock says when) while the heartbeat
    // moves the lease on: a duplicate then is still in progress; without the heartbeat it would take over
    await eventually(async () => (await db.store.lookup(db.pool, { key })) !== null, 'the claim');
    const claimedUntil = (await db.store.lookup(db.pool, { key }))!.lockedUntil!;
    await eventually(() => leaseOutlived(db.pool, key, claimedUntil), 'the lease to outlive its first end');
    const busy = await db.store.claim(db.pool, { key });
    assert.equal(busy.outcome, 'in_progress', 'the lease must still be live');
    finishJob();
    const done = await job;
    assert.equal(done.outcome, 'executed');
    assert.equal((await db.store.lookup(db.pool, { key }))?.state, 'succeeded');
  });
});

describe('version gates', () => {
  test('1.2-only options name version 1.2 on 1.1 and work on 1.2', async () => {
    const key = uniqueKey('gate');
    await db.store.claim(db.pool, { key });
    if (isV12) {
      const waited = await db.store.claim(db.pool, { key, wait: 0 });
      assert.equal(waited.outcome, 'in_progress');
      const row = await db.store.complete(db.pool, { key, body: Buffer.from([0, 1, 2]), headers: { 'content-type': 'x/y' }, ttl: 60_000 });
      assert.equal(row.state, 'succeeded');
      const replay = await db.store.claim(db.pool, { key });
      assert.deepEqual(replay.responseBody, Buffer.from([0, 1, 2]));
      return;
    }
    for (const call of [
      () => db.store.claim(db.pool, { key, wait: 100 }),
      () => db.store.complete(db.pool, { key, response: {}, body: 'x' }),
      () => db.store.extend(db.pool, { key, attempt: 1, lease: 1000 }),
      () => db.store.release(db.pool, { key, attempt: 1 }),
    ]) {
      const err = await call().catch((e: unknown) => e);
      assert.ok(err instanceof UnsupportedVersionError, String(err));
      assert.equal(err.requiredVersion, '1.2');
      assert.equal(err.installedVersion, '1.1');
    }
    // the rest still works
    const row = await db.store.complete(db.pool, { key, response: { ok: 1 } });
    assert.equal(row.state, 'succeeded');
  });

  test('a database without the extension gives a clear error', async () => {
    const pool = new Pool({ database: 'postgres', max: 1 });
    try {
      const store = new IdempotencyStore(pool);
      await assert.rejects(store.claim(pool, { key: 'k' }), /extension is not installed/);
    } finally {
      await pool.end();
    }
  });
});
