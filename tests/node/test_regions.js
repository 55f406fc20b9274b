'use strict';
// Regions from the Node package (client/node/regions.js over the C++ core's
// dgmm/regions.h) against a CPU dgmm-server with regions on: memfd regions
// passed by descriptor, jobs in place on views of their mapped bytes,
// multiply() on arrays in a region with no copy, the session, status and
// unregistering, the localSocket option, refusals. Run by ctest
// (node_regions), or by hand after `npm install` in client/node:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_regions.js

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const {
  CLIENT_DIR, installDependencies, startServer, stopServer, random, reference, assertClose,
} = require('./support.js');

installDependencies();

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);
const regions = require(path.join(CLIENT_DIR, 'regions.js'));

// Fresh random values in [-4, 4) for every run, from a seed that is printed:
// DGMM_TEST_SEED=<seed> runs the same values again.
const SEED = process.env.DGMM_TEST_SEED ? Number(process.env.DGMM_TEST_SEED) : crypto.randomInt(2 ** 31);
console.log(`# seed ${SEED} (DGMM_TEST_SEED=${SEED} reproduces this run)`);
const next = random(SEED);
function fillRandom(v) {
  for (let i = 0; i < v.length; i++) v[i] = next();
  return v;
}

async function assertCode(promise, codeName) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof dgmm.DgmmError, String(err));
    assert.equal(err.codeName, codeName, err.message);
    return true;
  });
}

let server;
let client;
before(async () => {
  server = await startServer(['--threads=2', '--allow_regions', '--region_memory_budget=64MiB']);
  client = dgmm.createClient(server.address);
});
after(async () => {
  if (client) client.close();
  if (server) await stopServer(server);
});

async function eventually(check, ms = 5000) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > until) throw err;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function assertNothingRegistered(c = client) {
  const status = await regions.regionStatus(c);
  assert.deepEqual(status.regions, []);
  assert.equal(status.registeredBytes, 0);
}

test('jobs in place on views of a region, every layout and side, the diagonal inline', async () => {
  const rows = 37;
  const cols = 23;
  const shm = await regions.createSharedMemoryRegion(client, 64 * 1024, 'node-views');
  try {
    assert.equal(shm.name, 'node-views');
    assert.equal(shm.buffer.byteLength, 64 * 1024);
    for (const Ctor of [Float32Array, Float64Array]) {
      for (const side of ['right', 'left']) {
        for (const layout of ['row', 'col']) {
          const a = shm.view(Ctor, 0, rows * cols);
          const before = Ctor.from(fillRandom(a));
          const d = fillRandom(new Ctor(side === 'right' ? cols : rows));
          const stats = await regions.multiplyRegion(client, {
            rows, cols, dtype: Ctor === Float32Array ? 'float32' : 'float64', layout, side, diagonal: d,
            matrix: shm.ref(0), result: shm.ref(0),
          });
          assert.equal(stats.bytesOut, a.byteLength);
          assertClose(a, reference(before, rows, cols, d, side, layout), Ctor === Float32Array ? 1e-6 : 1e-15);
        }
      }
    }
    // C after A in the same region.
    const a = fillRandom(shm.view(Float64Array, 0, rows * cols));
    const d = fillRandom(new Float64Array(cols));
    const offset = 8 * rows * cols;
    await regions.multiplyRegion(client, { rows, cols, dtype: 'float64', diagonal: d, matrix: shm.ref(0), result: shm.ref(offset) });
    assertClose(shm.view(Float64Array, offset, rows * cols), reference(a, rows, cols, d, 'right', 'row'), 1e-15);
    assert.equal((await regions.regionStatus(client, 'node-views')).regions[0].jobsTotal, 9);
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();
});

test('multiply() on arrays that lie in a region of the client runs there, copying nothing', async () => {
  const n = 600;  // 1.44 MB float32: a same-host job
  const shm = await regions.createSharedMemoryRegion(client, 2 * 4 * n * n, 'node-own');
  try {
    const a = fillRandom(shm.view(Float32Array, 0, n * n));
    const out = shm.view(Float32Array, 4 * n * n, n * n).fill(NaN);
    const d = fillRandom(new Float32Array(n));
    const { result, info } = await dgmm.multiply(client, a, n, n, d, 'left', { out, returnInfo: true });
    assert.equal(result, out);
    assert.equal(info.mode, 'shm', info.socketReason);
    assertClose(out, reference(a, n, n, d, 'left', 'row'), 1e-6);
    assert.equal(info.sameHost.copyIn, 0);
    assert.equal(info.sameHost.copyOut, 0);
    // The job ran in this region: no staging region appeared.
    const status = await regions.regionStatus(client);
    assert.deepEqual(status.regions.map((r) => r.name), ['node-own']);
  } finally {
    await shm.close();
  }
});

test('the session: the hello names this process; a name is taken once', async () => {
  const hello = await regions.regionSession(client);
  assert.equal(hello.uid, process.getuid());
  assert.equal(hello.pid, process.pid);
  const shm = await regions.createSharedMemoryRegion(client, 4096, 'node-uid');
  try {
    assert.equal((await regions.regionStatus(client, 'node-uid')).regions.length, 1);
    await assertCode(regions.createSharedMemoryRegion(client, 4096, 'node-uid'), 'ALREADY_EXISTS');
    assert.equal(await regions.unregisterRegion(client, 'node-uid'), 1);
    assert.deepEqual((await regions.regionStatus(client)).regions, []);
  } finally {
    await shm.close();
  }
});

test('a region keeps its client\'s session until it is closed, after the client\'s close()', async () => {
  const other = dgmm.createClient(server.address);
  const shm = await regions.createSharedMemoryRegion(other, 4096, 'node-session-bound');
  assert.equal((await regions.regionStatus(other, 'node-session-bound')).regions.length, 1);
  other.close();
  await assertCode(regions.regionStatus(other), 'CANCELLED');
  // Regions are the uid's: this client sees it, still registered.
  assert.equal((await regions.regionStatus(client)).registeredBytes, 4096);
  await shm.close();
  await eventually(async () => assertNothingRegistered());
});

test('the localSocket option: another path to the same socket, a missing one, another server\'s', async () => {
  const info = await dgmm.serverInfo(client);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dgmm-node-sock-'));
  const link = path.join(dir, 'seen-elsewhere.sock');
  fs.symlinkSync(info.limits.localSocket, link);
  const second = await startServer(['--threads=1', '--allow_regions']);
  const clients = [];
  const make = (address, localSocket) => {
    const c = dgmm.createClient(address, undefined, { localSocket });
    clients.push(c);
    return c;
  };
  try {
    const viaLink = make(server.address, link);
    const shm = await regions.createSharedMemoryRegion(viaLink, 8 * 6, 'node-via-link');
    const a = fillRandom(shm.view(Float64Array, 0, 6));
    const before = Float64Array.from(a);
    const d = fillRandom(new Float64Array(3));
    await regions.multiplyRegion(viaLink, { rows: 2, cols: 3, dtype: 'float64', diagonal: d, matrix: shm.ref(0), result: shm.ref(0) });
    assertClose(a, reference(before, 2, 3, d, 'right', 'row'), 1e-15);
    await shm.close();
    const missing = make(server.address, path.join(dir, 'missing.sock'));
    await assert.rejects(regions.regionStatus(missing), (err) => err instanceof dgmm.DgmmError && err.codeName !== 'OK');
    const secondInfo = await dgmm.serverInfo(make(second.address));
    assert.notEqual(secondInfo.instanceId, info.instanceId);
    const wrong = make(server.address, secondInfo.limits.localSocket);
    await assertCode(regions.regionStatus(wrong), 'FAILED_PRECONDITION');
    await assertCode(regions.regionStatus(wrong), 'FAILED_PRECONDITION');
  } finally {
    for (const c of clients) c.close();
    await stopServer(second);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  await eventually(async () => assertNothingRegistered());
});

test('refusals: names, ranges, regions off', async () => {
  await assertCode(regions.createSharedMemoryRegion(client, 4096, 'a/b'), 'INVALID_ARGUMENT');
  await assert.rejects(regions.createSharedMemoryRegion(client, 0), RangeError);
  const shm = await regions.createSharedMemoryRegion(client, 4096, 'node-range');
  try {
    assert.throws(() => shm.ref(4097), RangeError);
    // 32 x 32 float32 is 4096 bytes: from offset 8 it runs past the region.
    await assertCode(regions.multiplyRegion(client, { rows: 32, cols: 32, dtype: 'float32', diagonal: new Float32Array(32),
      matrix: shm.ref(8), result: shm.ref(8) }), 'INVALID_ARGUMENT');
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();

  const off = await startServer(['--threads=2']);
  const offClient = dgmm.createClient(off.address);
  try {
    const info = await dgmm.serverInfo(offClient);
    assert.equal(info.limits.regionsEnabled, false);
    await assertCode(regions.createSharedMemoryRegion(offClient, 4096, 'x'), 'FAILED_PRECONDITION');
  } finally {
    offClient.close();
    await stopServer(off);
  }
});
