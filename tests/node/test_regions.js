'use strict';
// The Node.js client's shared-memory regions (client/node/regions.js) against
// the real CPU dgmm-server with --allow_regions. Run by ctest (test
// `node_regions`), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_regions.js
// Needs client/node's dependencies installed (the node_client test installs
// them); exits 77 (skipped) when they are missing.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const CLIENT_DIR = path.resolve(__dirname, '..', '..', 'client', 'node');
try {
  require.resolve('@grpc/grpc-js', { paths: [CLIENT_DIR] });
} catch {
  console.log(`SKIP: @grpc/grpc-js is not installed in ${CLIENT_DIR} (npm ci there)`);
  process.exit(77);
}

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);
const regions = require(path.join(CLIENT_DIR, 'regions.js'));
const { startServer, stopServer, random, reference, assertClose } = require('./support.js');

// Fresh random values in [-4, 4) for every run, from a seed that is printed:
// DGMM_TEST_SEED=<seed> runs the same values again.
const SEED = process.env.DGMM_TEST_SEED ? Number(process.env.DGMM_TEST_SEED) : crypto.randomInt(2 ** 31);
console.log(`# seed ${SEED} (DGMM_TEST_SEED=${SEED} reproduces this run)`);
const next = random(SEED);
function randomArray(Ctor, n) {
  const out = new Ctor(n);
  for (let i = 0; i < n; i++) out[i] = next();
  return out;
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

async function assertNothingRegistered() {
  const status = await regions.regionStatus(client);
  assert.deepEqual(status.regions, []);
  assert.equal(status.registeredBytes, 0);
  const info = await dgmm.serverInfo(client);
  for (const device of info.devices) assert.equal(device.reservedBytes, 0);
}

test('round trips for every dtype, layout and side through a shared-memory region', async () => {
  const rows = 53;
  const cols = 37;
  const shm = regions.createSharedMemoryRegion(rows * cols * 8 + 4096);
  try {
    const status = await shm.register(client, 'node-jobs', { offset: 4096 });
    assert.equal(status.key, shm.key);
    assert.equal(status.byteSize, rows * cols * 8);
    for (const Ctor of [Float32Array, Float64Array]) {
      for (const layout of ['row', 'col']) {
        for (const side of ['right', 'left']) {
          const a = randomArray(Ctor, rows * cols);
          const d = randomArray(Ctor, side === 'right' ? cols : rows);
          // Poison the whole region: a job that did not run leaves NaN behind.
          shm.write(new Float64Array(shm.byteSize / 8).fill(NaN), 0);
          const { result, stats } = await shm.multiply(client, a, rows, cols, d, side, { layout });
          assert.ok(result instanceof Ctor);
          assertClose(result, reference(a, rows, cols, d, side, layout), Ctor === Float32Array ? 1e-6 : 1e-15);
          assert.equal(stats.bytesOut, a.byteLength);
          assert.equal(stats.backend, 'BACKEND_CPU');
        }
      }
    }
    assert.equal((await regions.regionStatus(client, 'node-jobs')).regions[0].jobsTotal, 8);
  } finally {
    await shm.close();
  }
  assert.equal(fs.existsSync(shm.path), false);
  await assertNothingRegistered();
});

test('raw jobs on refs, the diagonal in the region', async () => {
  const rows = 20;
  const cols = 30;
  const shm = regions.createSharedMemoryRegion(2 * rows * cols * 8 + cols * 8);
  try {
    await shm.register(client, 'node-raw');
    const a = randomArray(Float64Array, rows * cols);
    const d = randomArray(Float64Array, cols);
    shm.write(a, 0);
    shm.write(new Float64Array(rows * cols).fill(NaN), a.byteLength);
    shm.write(d, 2 * a.byteLength);
    const stats = await regions.multiplyRegion(client, {
      header: { rows, cols, dtype: 'DTYPE_FLOAT64', side: 'SIDE_RIGHT' },
      matrix: shm.ref(0),
      result: shm.ref(a.byteLength),
      diagonal: shm.ref(2 * a.byteLength),
    });
    assertClose(shm.read(new Float64Array(rows * cols), a.byteLength), reference(a, rows, cols, d, 'right', 'row'), 1e-15);
    assert.equal(stats.bytesIn, a.byteLength); // The matrix; the diagonal is not counted.
    // A result range past the region's end.
    await assertCode(regions.multiplyRegion(client, {
      header: { rows, cols, dtype: 'DTYPE_FLOAT64', diagonal: Buffer.from(d.buffer) },
      matrix: shm.ref(0),
      result: shm.ref(a.byteLength + 8 * cols + 8),
    }), 'INVALID_ARGUMENT');
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();
});

test('bad inputs: names, keys, missing objects, duplicates, regions off', async () => {
  assert.throws(() => regions.createSharedMemoryRegion(64, { key: '/../etc' }), /shared-memory key/);
  const shm = regions.createSharedMemoryRegion(4096);
  try {
    await assert.rejects(shm.register(client, 'a/b'), /region name/);
    await shm.register(client, 'node-dup');
    const other = regions.createSharedMemoryRegion(4096);
    try {
      await assertCode(other.register(client, 'node-dup'), 'ALREADY_EXISTS');
    } finally {
      await other.close();
    }
    await assertCode(new Promise((resolve, reject) => client.RegisterRegion(
      { name: 'gone', systemShm: { key: `/dgmm-node-none-${process.pid}`, offset: 0, byteSize: 64 } },
      (err, r) => (err ? reject(dgmm.DgmmError.fromServiceError(err)) : resolve(r)))), 'NOT_FOUND');
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();

  const off = await startServer(['--threads=2']);
  const offClient = dgmm.createClient(off.address);
  const shm2 = regions.createSharedMemoryRegion(4096);
  try {
    assert.equal((await dgmm.serverInfo(offClient)).limits.regionsEnabled, false);
    await assertCode(shm2.register(offClient, 'x'), 'FAILED_PRECONDITION');
  } finally {
    await shm2.close();
    offClient.close();
    await stopServer(off);
  }
});
