'use strict';
// The Node client's policy (docs/protocol.md section 9) against the real
// server: thresholds, striping over separate connections, resume after a reset
// connection, one status per job, the deadline, backend names.
// Run by ctest (test `node_client_policy`), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_policy.js

const assert = require('node:assert/strict');

const {
  CLIENT_DIR, installDependencies, startServer, stopServer, random, reference, assertClose, startProxy,
} = require('./support');

installDependencies();

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);

const KIB = 1024;
const MIB = 1024 * 1024;
const SMALL = { maxUnaryMessageBytes: 256 * KIB, chunkBytes: 64 * KIB };

let server;
before(async () => { server = await startServer(); });
after(async () => { if (server) await stopServer(server); });

function job(Ctor, rows, cols, side, seed) {
  const next = random(seed);
  const a = Ctor.from({ length: rows * cols }, next);
  const d = Ctor.from({ length: side === 'right' ? cols : rows }, next);
  return { a, d, out: new Ctor(rows * cols).fill(NaN) };
}

const rtolOf = (Ctor) => (Ctor === Float32Array ? 1e-6 : 1e-15);

test('policy functions: thresholds, auto K, ranges', () => {
  assert.equal(dgmm.unaryThreshold(), 4 * MIB);
  assert.equal(dgmm.unaryThreshold(MIB, 4 * MIB), 917504);
  assert.equal(dgmm.transferMode(4 * MIB - 4, 4), 'unary');
  assert.equal(dgmm.transferMode(4 * MIB - 4, 5), 'stream');
  // A line longer than C: unary up to U - 64 KiB.
  assert.equal(dgmm.transferMode(9600000, 16, 16 * MIB, 4 * MIB, 4800000), 'unary');
  assert.equal(dgmm.transferMode(16 * MIB - 65536, 0, 16 * MIB, 4 * MIB, 5 * MIB), 'unary');
  assert.equal(dgmm.transferMode(16 * MIB - 65535, 0, 16 * MIB, 4 * MIB, 5 * MIB), 'stream');
  assert.equal(dgmm.transferMode(9600000, 16, 16 * MIB, 4 * MIB, 4 * MIB), 'stream');
  assert.equal(dgmm.stripeCount(64 * MIB - 1, 4096), 1);
  assert.equal(dgmm.stripeCount(64 * MIB, 4096), 2);
  assert.equal(dgmm.stripeCount(10 * 1024 * MIB, 4096), 8);
  assert.equal(dgmm.stripeCount(10 * 1024 * MIB, 3), 3);
  assert.deepEqual(dgmm.stripeRanges(10, 4), [[0, 3], [3, 3], [6, 2], [8, 2]]);
  for (const bad of [0, -1, 2.5, '2', true]) {
    assert.throws(() => dgmm.stripeCount(10, 10, bad), (err) => err.codeName === 'INVALID_ARGUMENT');
  }
});

test('backend names: the policy names and enum names run; others are INVALID_ARGUMENT before any call', async () => {
  const client = dgmm.createClient(server.address);
  const { a, d } = job(Float64Array, 6, 5, 'right', 1);
  try {
    for (const backend of ['auto', 'cpu', 'BACKEND_AUTO', 'BACKEND_CPU']) {
      assertClose(await dgmm.multiply(client, a, 6, 5, d, 'right', { backend }), reference(a, 6, 5, d, 'right', 'row'), 1e-15);
    }
    // A valid name the CPU-only server cannot honour: the server says so.
    await assert.rejects(dgmm.multiply(client, a, 6, 5, d, 'right', { backend: 'cuda-kernel' }),
      (err) => err.codeName === 'INVALID_ARGUMENT' && err.info && err.info.attempts === 1);
  } finally {
    client.close();
  }
  const proxy = await startProxy(server.port);
  const counted = dgmm.createClient(proxy.address);
  try {
    for (const backend of ['gpu', 'cuda_kernel', 'cuda', 'CPU', 'Auto', '', 7]) {
      await assert.rejects(dgmm.multiply(counted, a, 6, 5, d, 'right', { backend }),
        (err) => err instanceof dgmm.DgmmError && err.codeName === 'INVALID_ARGUMENT' && err.info === null,
        `backend ${backend}`);
    }
    assert.equal(proxy.connections, 0, 'a refused backend name made a connection');
  } finally {
    counted.close();
    await proxy.close();
  }
});

test('the default threshold is 4 MiB of matrix and diagonal', async () => {
  const client = dgmm.createClient(server.address);
  try {
    for (const [cols, mode] of [[1023, 'unary'], [1024, 'stream']]) {
      const { a, d } = job(Float32Array, 1024, cols, 'left', cols);
      const { result, info } = await dgmm.multiply(client, a, 1024, cols, d, 'left', { returnInfo: true });
      assert.deepEqual([info.mode, info.stripes, info.attempts], [mode, 1, 1]);
      assertClose(result, reference(a, 1024, cols, d, 'left', 'row'), 1e-6);
    }
  } finally {
    client.close();
  }
});

for (const Ctor of [Float32Array, Float64Array]) {
  for (const layout of ['row', 'col']) {
    for (const side of ['right', 'left']) {
      test(`striped ${Ctor.name} ${layout}-major ${side}: 3 parts on 3 connections, exact, in place`, async () => {
        const rows = 301;
        const cols = 203;
        const { a, d, out } = job(Ctor, rows, cols, side, rows + cols);
        const proxy = await startProxy(server.port);
        const client = dgmm.createClient(proxy.address);
        const progress = [];
        try {
          const { result, stats, info } = await dgmm.multiply(client, a, rows, cols, d, side, {
            layout, stripes: 3, out, returnInfo: true, progress: (done, total) => progress.push([done, total]), ...SMALL,
          });
          assert.equal(result, out);
          assertClose(out, reference(a, rows, cols, d, side, layout), rtolOf(Ctor));
          assert.equal(info.stripes, 3);
          assert.equal(info.attempts, 3);
          assert.match(info.groupId, /^[0-9a-f]{16}$/);
          assert.ok(proxy.connections >= 3, `${proxy.connections} connections`);
          assert.equal(info.stats.reduce((s, x) => s + Number(x.bytesIn), 0), a.byteLength);
          assert.equal(Number(stats.bytesOut), a.byteLength);
          const lines = layout === 'col' ? cols : rows;
          assert.deepEqual(progress.at(-1), [lines, lines]);
        } finally {
          client.close();
          await proxy.close();
        }
      });
    }
  }
}

test('K is capped at the number of lines; one part is not a group', async () => {
  const client = dgmm.createClient(server.address);
  try {
    const { a, d } = job(Float64Array, 5, 300, 'right', 3);
    let { result, info } = await dgmm.multiply(client, a, 5, 300, d, 'right', { stripes: 50, returnInfo: true, ...SMALL });
    assert.equal(info.stripes, 5);
    assertClose(result, reference(a, 5, 300, d, 'right', 'row'), 1e-15);
    ({ result, info } = await dgmm.multiply(client, a, 5, 300, d, 'right', { returnInfo: true, ...SMALL }));
    assert.equal(info.stripes, 1);
    assert.equal(info.groupId, '');
    assert.equal(info.stats[0].group, null);
  } finally {
    client.close();
  }
});

async function withResets(resets, stripes, maxAttempts = 4, rows = 2000) {
  const cols = 500;
  const { a, d, out } = job(Float32Array, rows, cols, 'left', 11);
  const proxy = await startProxy(server.port, { resets, resetAfterBytes: MIB, resetAfterResultBytes: 128 * KIB });
  const client = dgmm.createClient(proxy.address, undefined, { retry: { maxAttempts } });
  const start = Date.now();
  try {
    const { info } = await dgmm.multiply(client, a, rows, cols, d, 'left', { stripes, out, returnInfo: true, timeoutMs: 30000, ...SMALL });
    return { a, d, out, info, error: null, resetsDone: proxy.resetsDone, elapsed: Date.now() - start, rows, cols };
  } catch (error) {
    if (!(error instanceof dgmm.DgmmError)) throw error;
    return { a, d, out, info: error.info, error, resetsDone: proxy.resetsDone, elapsed: Date.now() - start, rows, cols };
  } finally {
    client.close();
    await proxy.close();
  }
}

test('a stream reset mid-way resumes with only the missing lines', async () => {
  const r = await withResets(1, 1);
  assert.equal(r.error, null);
  assert.equal(r.resetsDone, 1);
  assert.deepEqual([r.info.mode, r.info.attempts, r.info.resumed], ['stream', 2, 1]);
  assertClose(r.out, reference(r.a, r.rows, r.cols, r.d, 'left', 'row'), 1e-6);
  assert.ok(Number(r.info.stats[0].bytesIn) < r.a.byteLength, 'the resumed attempt resent received lines');
});

test('striped parts resume independently', async () => {
  const r = await withResets(2, 2);
  assert.equal(r.error, null);
  assert.equal(r.resetsDone, 2);
  // Each part once, and once more after its reset. One attempt more was seen
  // once in a full ./test.sh on the 2-core machine (the job right, both
  // resets done; not reproduced in 13 runs alone or under load, cause not
  // pinned down): the part's retry budget allows it, so it is not a failure.
  assert.ok(r.info.attempts === 4 || r.info.attempts === 5, `attempts ${r.info.attempts}`);
  assert.ok(r.info.resumed >= 1);
  assertClose(r.out, reference(r.a, r.rows, r.cols, r.d, 'left', 'row'), 1e-6);
});

test('without retries the first failure is the job\'s one status', async () => {
  const r = await withResets(1, 2, 1, 4000);
  assert.ok(r.error);
  assert.equal(r.error.codeName, 'UNAVAILABLE');
  assert.equal(r.info.attempts, 2); // One per part, none retried.
  assert.ok(r.elapsed < 20000);
});

test('one deadline covers every part', async () => {
  const client = dgmm.createClient(server.address);
  try {
    const a = new Float64Array(3000 * 3000).fill(1.5);
    const d = new Float64Array(3000).fill(2);
    const start = Date.now();
    await assert.rejects(dgmm.multiply(client, a, 3000, 3000, d, 'right', { stripes: 4, timeoutMs: 50 }),
      (err) => err.codeName === 'DEADLINE_EXCEEDED');
    assert.ok(Date.now() - start < 5000);
  } finally {
    client.close();
  }
});
