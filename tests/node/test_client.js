'use strict';
// The Node.js package (client/node, a binding of the C++ client) against the
// real dgmm-server over loopback. Run by ctest (test `node_client`, on the
// package node_package installed), or by hand after `npm install` in
// client/node:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_client.js

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const {
  CLIENT_DIR, installDependencies, startServer, stopServer, stopProcess, random, reference, assertClose,
} = require('./support');

const EXAMPLE = path.join(CLIENT_DIR, 'examples', 'quickstart.js');

installDependencies();

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);

let server;
let client;
before(async () => {
  server = await startServer();
  client = dgmm.createClient(server.address);
});
after(async () => {
  if (client) client.close();
  if (server) await stopServer(server);
});

async function checkMultiply(Ctor, rows, cols, side, options = {}) {
  const next = random(rows * 31 + cols);
  const a = Ctor.from({ length: rows * cols }, next);
  const d = Ctor.from({ length: side === 'right' ? cols : rows }, next);
  const c = await dgmm.multiply(client, a, rows, cols, d, side, options);
  assert.ok(c instanceof Ctor, `result is a ${Ctor.name}`);
  assertClose(c, reference(a, rows, cols, d, side, options.layout || 'row'), Ctor === Float32Array ? 1e-6 : 1e-15);
}

for (const Ctor of [Float32Array, Float64Array]) {
  for (const side of ['right', 'left']) {
    for (const layout of ['row', 'col']) {
      test(`${Ctor.name} ${side} ${layout}-major matches a float64 reference`, () =>
        checkMultiply(Ctor, 67, 41, side, { layout }));
    }
  }
  test(`${Ctor.name} streamed in small blocks matches a float64 reference`, () =>
    checkMultiply(Ctor, 300, 200, 'left', { stream: true, blockBytes: 4096 }));
}

test('a 2000x1500 Float64Array (24 MB) goes through MultiplyStream, reporting progress to the last line', async () => {
  const rows = 2000;
  const cols = 1500;
  const next = random(7);
  const a = Float64Array.from({ length: rows * cols }, next);
  const d = Float64Array.from({ length: cols }, next);
  const reports = [];
  const { result, stats, info } = await dgmm.multiply(client, a, rows, cols, d, 'right',
    { returnInfo: true, progress: (done, total) => reports.push([done, total]) });
  assertClose(result, reference(a, rows, cols, d, 'right', 'row'), 1e-15);
  assert.equal(stats.bytesIn, a.byteLength);
  assert.equal(info.mode, 'stream');
  assert.ok(reports.length >= 1);
  assert.deepEqual(reports.at(-1), [rows, rows]);
  for (let i = 1; i < reports.length; i++) assert.ok(reports[i][0] >= reports[i - 1][0], 'progress never goes back');
});

test('the job runs off the JS thread: timers fire while a large job runs', async () => {
  const n = 3000;
  const a = new Float32Array(n * n).fill(1.5);
  const d = new Float32Array(n).fill(2);
  let ticks = 0;
  const timer = setInterval(() => { ticks += 1; }, 1);
  try {
    const start = performance.now();
    const c = await dgmm.multiply(client, a, n, n, d, 'right', { stream: true });
    const ms = performance.now() - start;
    assert.equal(c[n * n - 1], 3);
    // A job that held the JS thread would let no timer fire until it ended.
    assert.ok(ticks >= Math.min(5, ms / 10), `${ticks} ticks in ${ms.toFixed(0)} ms`);
  } finally {
    clearInterval(timer);
  }
});

test('typed arrays are read and written in place: views at an offset, out filled', async () => {
  const buffer = new ArrayBuffer(8 * 200);
  const a = new Float64Array(buffer, 8 * 7, 6 * 5);      // a view at an offset
  a.set(Float64Array.from({ length: 30 }, (_, i) => i - 10));
  const d = Float64Array.from([1, -2, 3, 0.5, 4]);
  const outBuffer = new Float64Array(100);
  const out = outBuffer.subarray(3, 33);
  const c = await dgmm.multiply(client, a, 6, 5, d, 'right', { out });
  assert.equal(c, out);
  assertClose(out, reference(a, 6, 5, d, 'right', 'row'), 1e-15);
  assert.equal(outBuffer[2], 0);
  assert.equal(outBuffer[33], 0);
  await assert.rejects(dgmm.multiply(client, a, 6, 5, d, 'right', { out: new Float32Array(30) }), TypeError);
});

test('small jobs: the same results from a server without MultiplySmall', async () => {
  const rows = 60;
  const cols = 40;
  const next = random(11);
  const a = Float64Array.from({ length: rows * cols }, next);
  const d = Float64Array.from({ length: rows }, next);
  const expected = reference(a, rows, cols, d, 'left', 'row');
  assertClose(await dgmm.multiply(client, a, rows, cols, d, 'left'), expected, 1e-15);
  const old = await startServer(['--multiply_small=false']);
  const oldClient = dgmm.createClient(old.address);
  try {
    for (let round = 0; round < 2; round++) {
      const { result, info } = await dgmm.multiply(oldClient, a, rows, cols, d, 'left', { returnInfo: true });
      assertClose(result, expected, 1e-15);
      assert.equal(info.mode, 'unary');
    }
  } finally {
    oldClient.close();
    await stopServer(old);
  }
});

test('multiplyBatch: one call, a result or an error per job', async () => {
  const a = Float32Array.from({ length: 12 }, (_, i) => i + 1);
  const d3 = Float32Array.from([1, 2, 3]);
  const d4 = Float64Array.from([1, -1, 2, -2]);
  const done = await dgmm.multiplyBatch(client, [
    { a, rows: 4, cols: 3, diag: d3 },
    { a, rows: 4, cols: 3, diag: d3, side: 'left' },   // wrong length: this job fails alone
    { a, rows: 4, cols: 3, diag: d4, side: 'left', options: { layout: 'col' } },
  ]);
  assert.equal(done.length, 3);
  assertClose(done[0].result, reference(a, 4, 3, d3, 'right', 'row'), 1e-6);
  assert.ok(done[1].error instanceof dgmm.DgmmError);
  assert.equal(done[1].error.codeName, 'INVALID_ARGUMENT');
  assert.ok(done[2].result instanceof Float64Array);  // float32 A, float64 d: C is float64
  assertClose(done[2].result, reference(a, 4, 3, d4, 'left', 'col'), 1e-12);
});

test('a bearer token is sent on every call; without it the server answers UNAUTHENTICATED', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dgmm-node-token-'));
  const token = `node-token-${Math.random().toString(36).slice(2)}`;
  fs.writeFileSync(path.join(dir, 'token'), `${token}\n`);
  const secured = await startServer([`--auth_token_file=${path.join(dir, 'token')}`]);
  const withToken = dgmm.createClient(secured.address, undefined, { token });
  const without = dgmm.createClient(secured.address);
  try {
    const a = Float32Array.from({ length: 12 }, (_, i) => 0.5 + i / 8);
    const d = Float32Array.from([2, 0.5, 4]);
    const c = await dgmm.multiply(withToken, a, 4, 3, d, 'right');
    for (let i = 0; i < 12; i++) assert.strictEqual(c[i], Math.fround(a[i] * d[i % 3]));
    await assert.rejects(dgmm.multiply(without, a, 4, 3, d, 'right'),
      (err) => err instanceof dgmm.DgmmError && err.code === dgmm.status.UNAUTHENTICATED);
  } finally {
    withToken.close();
    without.close();
    await stopServer(secured);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a wrong diagonal length is INVALID_ARGUMENT with the server\'s message', async () => {
  for (const stream of [false, true]) {
    await assert.rejects(
      dgmm.multiply(client, new Float64Array(30 * 20), 30, 20, new Float64Array(19), 'right', { stream }),
      (err) => err instanceof dgmm.DgmmError && err.code === dgmm.status.INVALID_ARGUMENT &&
        err.codeName === 'INVALID_ARGUMENT' && /diagonal/i.test(err.details) && err.retryAfterMs === null);
  }
});

test('bad options are refused before any call', async () => {
  await assert.rejects(dgmm.multiply(client, new Float32Array(4), 2, 2, new Float32Array(2), 'right', { backend: 'gpu' }),
    (err) => err instanceof dgmm.DgmmError && err.codeName === 'INVALID_ARGUMENT');
  await assert.rejects(dgmm.multiply(client, new Float32Array(4), 2, 2, new Float32Array(2), 'up'), RangeError);
  await assert.rejects(dgmm.multiply(client, new Float32Array(5), 2, 2, new Float32Array(2)), RangeError);
  assert.throws(() => dgmm.createClient('127.0.0.1:1', undefined, { retry: { maxAttempts: 0 } }),
    (err) => err instanceof dgmm.DgmmError && err.codeName === 'INVALID_ARGUMENT' && /max_attempts/.test(err.details));
});

test('server info reports limits and every dtype', async () => {
  const info = await dgmm.serverInfo(client);
  assert.ok(info.version);
  assert.ok(info.limits.maxBlockBytes > 0);
  assert.deepEqual([...info.dtypes].sort(), ['DTYPE_BFLOAT16', 'DTYPE_COMPLEX128', 'DTYPE_COMPLEX64',
    'DTYPE_FLOAT16', 'DTYPE_FLOAT32', 'DTYPE_FLOAT64']);
});

test('health is SERVING', async () => {
  assert.equal(await dgmm.health(client), 'SERVING');
});

test('the quickstart example runs', () => {
  const run = childProcess.spawnSync(process.execPath, [EXAMPLE, server.address], { encoding: 'utf8', timeout: 60000 });
  assert.equal(run.status, 0, run.stdout + run.stderr);
  assert.match(run.stdout, /health: SERVING/);
  assert.match(run.stdout, /rejected: INVALID_ARGUMENT/);
});

test('retryDelay is the core\'s rule 3 (UNAVAILABLE backs off; pushback only with the trailer)', () => {
  const policy = { ...dgmm.DEFAULT_RETRY_POLICY, maxAttempts: 10, initialBackoffMs: 100, maxBackoffMs: 350 };
  const s = dgmm.status;
  assert.equal(dgmm.retryDelay(policy, 1, s.UNAVAILABLE, null, 0, Infinity, 0), 100);
  assert.equal(dgmm.retryDelay(policy, 2, s.UNAVAILABLE, null, 0, Infinity, 0), 200);
  assert.equal(dgmm.retryDelay(policy, 3, s.UNAVAILABLE, null, 0, Infinity, 0), 350);
  assert.ok(Math.abs(dgmm.retryDelay(policy, 1, s.UNAVAILABLE, null, 0, Infinity, 1) - 120) < 1e-9);
  assert.equal(dgmm.retryDelay(policy, 10, s.UNAVAILABLE, null, 0, Infinity, 0), null);
  assert.equal(dgmm.retryDelay(policy, 1, s.RESOURCE_EXHAUSTED, 42, 0, Infinity, 0), 42);
  assert.equal(dgmm.retryDelay(policy, 1, s.RESOURCE_EXHAUSTED, null, 0, Infinity, 0), null);
  assert.equal(dgmm.retryDelay(policy, 1, s.INVALID_ARGUMENT, null, 0, Infinity, 0), null);
  assert.equal(dgmm.retryDelay(policy, 1, s.UNAVAILABLE, null, 0, 50, 0), null); // past the deadline
  for (const code of [s.INTERNAL, s.UNKNOWN, s.RESOURCE_EXHAUSTED]) {
    assert.equal(dgmm.retryDelay(policy, 1, code, null, 0, Infinity, 0, false), 100);
    assert.equal(dgmm.retryDelay(policy, 1, code, null, 0, Infinity, 0, true), null);
  }
});

// A loopback port nothing listens on (bound, read, released).
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = require('node:net').createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

test('a dead server fails fast without retries, and after the reconnect wait with them', async () => {
  const port = await freePort();
  const a = new Float32Array(16).fill(1);
  const d = new Float32Array(4).fill(1);
  const once = dgmm.createClient(`127.0.0.1:${port}`, undefined, { retry: { maxAttempts: 1 } });
  const retrying = dgmm.createClient(`127.0.0.1:${port}`, undefined, { retry: { maxReconnectWaitMs: 500 } });
  try {
    let start = Date.now();
    await assert.rejects(dgmm.multiply(once, a, 4, 4, d),
      (err) => err.code === dgmm.status.UNAVAILABLE && !/attempts/.test(err.details));
    assert.ok(Date.now() - start < 1000, `took ${Date.now() - start} ms`);
    start = Date.now();
    await assert.rejects(dgmm.multiply(retrying, a, 4, 4, d),
      (err) => err.code === dgmm.status.UNAVAILABLE &&
        /no connection to the server within/.test(err.details) && /\(after 2 attempts\)/.test(err.details));
    const elapsed = Date.now() - start;
    assert.ok(elapsed >= 500 && elapsed < 3000, `took ${elapsed} ms`);
  } finally {
    once.close();
    retrying.close();
  }
});

// True when a fresh client of `address` gets SERVING from health.
async function answersHealth(address) {
  const probe = dgmm.createClient(address);
  try {
    return (await dgmm.health(probe, '')) === 'SERVING';
  } catch {
    return false;
  } finally {
    probe.close();
  }
}

test('restart: 4 busy clients resume within 2 s of a restart on the same port', async () => {
  const CLIENTS = 4;
  const DOWNTIME_MS = 3000;
  const ALLOWED_MS = 2000;
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const flags = [`--listen=${address}`, '--threads=2'];
  let srv = await startServer(flags);
  assert.equal(srv.address, address);
  const now = () => performance.now();
  const successes = Array.from({ length: CLIENTS }, () => []);
  const errors = Array.from({ length: CLIENTS }, () => []);
  let stop = false;
  const loops = Array.from({ length: CLIENTS }, async (_, i) => {
    const c = dgmm.createClient(address);
    const next = random(100 + i);
    const a = Float32Array.from({ length: 256 }, next);
    const d = Float32Array.from({ length: 16 }, next);
    try {
      while (!stop) {
        try {
          const r = await dgmm.multiply(c, a, 16, 16, d, 'right');
          let right = true;
          for (let k = 0; k < 256; k++) right = right && r[k] === Math.fround(a[k] * d[k % 16]);
          if (right) successes[i].push(now()); else errors[i].push('wrong result');
        } catch (err) {
          errors[i].push(String(err));
        }
        await new Promise((r) => setTimeout(r, 2));
      }
    } finally {
      c.close();
    }
  });
  let killed;
  let restart;
  let up;
  try {
    const warm = Date.now() + 20000;
    while (Math.min(...successes.map((s) => s.length)) < 3 && Date.now() < warm) await new Promise((r) => setTimeout(r, 20));
    assert.ok(Math.min(...successes.map((s) => s.length)) >= 3, 'not every client ran 3 jobs before the kill');

    const exited = new Promise((r) => srv.proc.once('exit', (code, signal) => r(signal)));
    srv.proc.kill('SIGKILL');
    assert.equal(await exited, 'SIGKILL');
    killed = now();
    fs.rmSync(srv.dir, { recursive: true, force: true });
    srv = null;
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await answersHealth(address), false, `something still answers on ${address}`);

    await new Promise((r) => setTimeout(r, Math.max(0, killed + DOWNTIME_MS - now())));
    restart = now();
    srv = await startServer(flags);
    assert.equal(srv.address, address);
    while (!(await answersHealth(address))) {
      assert.ok(now() < restart + 20000, 'the restarted server never answered');
      await new Promise((r) => setTimeout(r, 5));
    }
    up = now();
    for (let i = 0; i < CLIENTS; i++) {
      assert.equal(successes[i].filter((t) => t >= killed && t < restart).length, 0,
        `client ${i} completed a job while the server was down`);
    }
    const giveUp = up + 25000;
    while (!successes.every((s) => s.some((t) => t >= restart)) && now() < giveUp) {
      await new Promise((r) => setTimeout(r, 10));
    }
  } finally {
    stop = true;
    await Promise.all(loops);
    if (srv) await stopServer(srv);
  }
  console.log(`# server down ${(restart - killed).toFixed(0)} ms, up ${(up - restart).toFixed(0)} ms after the restart; ` +
    'first job after it answered health (ms):');
  const firsts = successes.map((s) => s.find((t) => t >= restart));
  firsts.forEach((t, i) => console.log(`#   client ${i}: ${t === undefined ? 'none' : (t - up).toFixed(1)} ` +
    `(${errors[i].length} failed jobs; last error: ${errors[i].at(-1) || '-'})`));
  firsts.forEach((t, i) => {
    assert.notEqual(t, undefined, `client ${i} never completed a job after the restart`);
    assert.ok(t - up <= ALLOWED_MS, `client ${i} took ${(t - up).toFixed(1)} ms`);
  });
});

test('an AbortSignal ends a job within 100 ms: mid-job, in a backoff, and before it starts', async () => {
  const n = 4000;
  const a = new Float32Array(n * n).fill(1);
  const d = new Float32Array(n).fill(1);
  // Mid-job: a streamed 64 MB job over the socket.
  let controller = new AbortController();
  let job = dgmm.multiply(client, a, n, n, d, 'right', { stream: true, signal: controller.signal });
  await new Promise((r) => setTimeout(r, 30));
  let start = performance.now();
  controller.abort();
  await assert.rejects(job, (err) => err instanceof dgmm.DgmmError && err.codeName === 'CANCELLED');
  let ms = performance.now() - start;
  assert.ok(ms < 100, `cancelled after ${ms.toFixed(1)} ms`);
  // In the backoffs and connection waits of a dead server's retries.
  const port = await freePort();
  const dead = dgmm.createClient(`127.0.0.1:${port}`, undefined,
    { retry: { maxAttempts: 10, initialBackoffMs: 1000, maxBackoffMs: 2000, maxReconnectWaitMs: 5000 } });
  try {
    controller = new AbortController();
    job = dgmm.multiply(dead, new Float32Array(4), 2, 2, new Float32Array(2), 'right', { signal: controller.signal });
    await new Promise((r) => setTimeout(r, 300));
    start = performance.now();
    controller.abort();
    await assert.rejects(job, (err) => err.codeName === 'CANCELLED');
    ms = performance.now() - start;
    assert.ok(ms < 100, `cancelled after ${ms.toFixed(1)} ms`);
  } finally {
    dead.close();
  }
  // Aborted before the call: nothing is sent.
  controller = new AbortController();
  controller.abort();
  await assert.rejects(dgmm.multiply(client, new Float32Array(4), 2, 2, new Float32Array(2), 'right', { signal: controller.signal }),
    (err) => err.codeName === 'CANCELLED');
});

test('serverInfo and health take timeoutMs: a stopped server is DEADLINE_EXCEEDED after it', async () => {
  const frozen = await startServer();
  const c = dgmm.createClient(frozen.address);
  try {
    assert.equal(await dgmm.health(c, '', { timeoutMs: 5000 }), 'SERVING');  // connected
    await stopProcess(frozen);
    for (const [what, call] of [['serverInfo', () => dgmm.serverInfo(c, { timeoutMs: 200 })],
      ['health', () => dgmm.health(c, '', { timeoutMs: 200 })]]) {
      const start = performance.now();
      await assert.rejects(call(), (err) => err.codeName === 'DEADLINE_EXCEEDED', what);
      const ms = performance.now() - start;
      assert.ok(ms >= 150, `${what} gave up after ${ms.toFixed(0)} ms, before its timeout`);
    }
    await assert.rejects(dgmm.health(c, '', { timeoutMs: 'soon' }), TypeError);
  } finally {
    frozen.proc.kill('SIGCONT');
    c.close();
    await stopServer(frozen);
  }
});

test('timeoutMs bounds the whole job: DEADLINE_EXCEEDED', async () => {
  const n = 4000;
  const a = new Float32Array(n * n).fill(1);
  const d = new Float32Array(n).fill(1);
  await assert.rejects(dgmm.multiply(client, a, n, n, d, 'right', { stream: true, timeoutMs: 5 }),
    (err) => err.codeName === 'DEADLINE_EXCEEDED');
});

test('a full queue: RESOURCE_EXHAUSTED with the server\'s retryAfterMs', async () => {
  // The budget holds one streamed job and the queue one more: a third job,
  // from the client with the most waiting, is refused at once with the
  // grpc-retry-pushback-ms trailer.
  const busy = await startServer(['--max_queue=1', '--host_memory_budget=40MiB']);
  const c = dgmm.createClient(busy.address, undefined, { retry: { maxAttempts: 1 } });
  try {
    const big = new Float32Array(8000 * 2000).fill(1);
    const bigD = new Float32Array(2000).fill(2);
    let started;
    const running = dgmm.multiply(c, big, 8000, 2000, bigD, 'right', { stripes: 1, out: new Float32Array(big.length),
      progress: () => started && started() });
    await new Promise((r) => { started = r; });
    const waiting = dgmm.multiply(c, big, 8000, 2000, bigD, 'right', { stripes: 1 });
    await new Promise((r) => setTimeout(r, 200));
    await assert.rejects(dgmm.multiply(c, new Float32Array(200), 20, 10, new Float32Array(10), 'right'), (err) => {
      assert.equal(err.codeName, 'RESOURCE_EXHAUSTED', err.message);
      assert.ok(err.retryAfterMs > 0, `retryAfterMs ${err.retryAfterMs}`);
      assert.equal(err.attempts, 1);
      return true;
    });
    const [first, second] = await Promise.all([running, waiting]);
    assert.equal(first[0], 2);
    assert.equal(second[big.length - 1], 2);
  } finally {
    c.close();
    await stopServer(busy);
  }
});
