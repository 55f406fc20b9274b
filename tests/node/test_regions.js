'use strict';
// The Node.js client's shared-memory regions (client/node/regions.js) and
// its local-socket session (client/node/local_socket.js) against
// the real CPU dgmm-server with --allow_regions. Run by ctest (test
// `node_regions`), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_regions.js
// Needs client/node's dependencies installed (the node_client test installs
// them); exits 77 (skipped) when they are missing.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
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

// A raw region RPC; `session`: the dgmm-session metadata, or none.
function rawCall(target, method, request, session) {
  const metadata = new dgmm.grpc.Metadata();
  if (session !== undefined) metadata.set('dgmm-session', session);
  return new Promise((resolve, reject) => target[method](request, metadata,
    (err, r) => (err ? reject(dgmm.DgmmError.fromServiceError(err)) : resolve(r))));
}

// A POSIX shared-memory object made by hand with `mode` (fchmod: no umask),
// owned by this process unless `uid`; returns its key and a cleanup.
function makeObject(mode, bytes = 4096, uid = undefined) {
  const key = `/dgmm-node-test-${process.pid}-${crypto.randomBytes(4).toString('hex')}`;
  const file = `/dev/shm${key}`;
  const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600);
  try {
    fs.ftruncateSync(fd, bytes);
    if (uid !== undefined) fs.fchownSync(fd, uid, uid);
    fs.fchmodSync(fd, mode);
  } finally {
    fs.closeSync(fd);
  }
  return { key, file, remove: () => fs.rmSync(file, { force: true }) };
}

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
    assert.equal(status.key, shm.path); // What the server's descriptor names.
    assert.equal(status.kind, 'REGION_KIND_SYSTEM_SHM');
    assert.equal(status.byteSize, rows * cols * 8);
    assert.equal(status.offset, 4096);
    assert.equal(status.ownerUid, process.getuid());
    assert.equal(status.sealed, false);
    assert.equal(fs.statSync(shm.path).mode & 0o777, 0o600);
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

test('a region job: fresh random data, a result poisoned with NaN, a float64 reference', async () => {
  const rows = 61;
  const cols = 45;
  const n = rows * cols;
  const shm = regions.createSharedMemoryRegion(2 * n * 4);
  try {
    await shm.register(client, 'node-fresh');
    for (const side of ['right', 'left']) {
      const a = randomArray(Float32Array, n);
      const d = randomArray(Float32Array, side === 'right' ? cols : rows);
      shm.write(a, 0);
      shm.write(new Float32Array(n).fill(NaN), n * 4);
      const stats = await regions.multiplyRegion(client, {
        header: { rows, cols, dtype: 'DTYPE_FLOAT32', side: side === 'right' ? 'SIDE_RIGHT' : 'SIDE_LEFT', diagonal: Buffer.from(d.buffer) },
        matrix: shm.ref(0),
        result: shm.ref(n * 4),
      });
      const c = shm.read(new Float32Array(n), n * 4);
      assert.ok(c.every((x) => !Number.isNaN(x)), 'every result element was written');
      assertClose(c, reference(a, rows, cols, d, side, 'row'), 1e-6);
      assert.deepEqual(shm.read(new Float32Array(n), 0), a); // The matrix is left as it was.
      assert.equal(stats.bytesIn, n * 4);
      assert.equal(stats.bytesOut, n * 4);
    }
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();
});

test('the session: hello, and region calls without one are UNAUTHENTICATED', async () => {
  const info = await dgmm.serverInfo(client);
  assert.ok(info.limits.localSocket.startsWith('/'), info.limits.localSocket);
  assert.match(info.instanceId, /.+/);
  const session = await regions.regionSession(client);
  assert.equal(await regions.regionSession(client), session); // One per client.
  assert.equal(session.path, info.limits.localSocket);
  assert.equal(session.hello.instanceId, info.instanceId);
  assert.equal(session.hello.uid, process.getuid());
  assert.equal(session.hello.pid, process.pid);
  assert.match(session.session, /^[0-9a-f]{16,}$/);

  const shm = regions.createSharedMemoryRegion(4096);
  try {
    const { ticket } = await session.openShm(shm.key);
    const request = { name: 'node-nosession', localFd: { ticket, offset: 0, byteSize: 4096 } };
    await assertCode(rawCall(client, 'RegisterRegion', request), 'UNAUTHENTICATED');
    await assertCode(rawCall(client, 'RegisterRegion', request, 'f'.repeat(64)), 'UNAUTHENTICATED');
    await assertCode(rawCall(client, 'GetRegionStatus', {}), 'UNAUTHENTICATED');
    await assertCode(rawCall(client, 'UnregisterRegion', {}), 'UNAUTHENTICATED');
    await assertCode(rawCall(client, 'MultiplyRegion', {
      header: { rows: 1, cols: 1, dtype: 'DTYPE_FLOAT64', diagonal: Buffer.alloc(8) },
      matrix: { name: 'node-nosession' }, result: { name: 'node-nosession' },
    }), 'UNAUTHENTICATED');
    // The ticket was not taken by the refused calls.
    const status = await rawCall(client, 'RegisterRegion', request, session.session);
    assert.equal(status.region.name, 'node-nosession');
    // A ticket is used once.
    await assertCode(rawCall(client, 'RegisterRegion', { ...request, name: 'node-again' }, session.session), 'NOT_FOUND');
    // Registering by key is gone.
    await assertCode(rawCall(client, 'RegisterRegion',
      { name: 'node-bykey', systemShm: { key: shm.key, offset: 0, byteSize: 4096 } }, session.session), 'INVALID_ARGUMENT');
    assert.equal(await regions.unregisterRegion(client, 'node-nosession'), 1);
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();
});

test('open_shm: only objects of this uid that nobody else may write', async () => {
  const session = await regions.regionSession(client);
  await assertCode(session.openShm(`/dgmm-node-none-${process.pid}`), 'NOT_FOUND');
  await assertCode(session.openShm('/../etc'), 'INVALID_ARGUMENT');
  for (const mode of [0o666, 0o620, 0o602]) {
    const object = makeObject(mode);
    try {
      await assertCode(session.openShm(object.key), 'PERMISSION_DENIED');
    } finally {
      object.remove();
    }
  }
  if (process.getuid() === 0) {
    // Root can make an object another uid owns: the server refuses it too.
    const object = makeObject(0o600, 4096, 65534);
    try {
      await assertCode(session.openShm(object.key), 'PERMISSION_DENIED');
    } finally {
      object.remove();
    }
  }
  // Readable by others is allowed; the ticket belongs to this session only.
  const object = makeObject(0o644, 8192);
  const other = dgmm.createClient(server.address);
  try {
    const ticket = await session.openShm(object.key);
    assert.equal(ticket.objectBytes, 8192);
    assert.equal(ticket.sealed, false);
    const otherSession = await regions.regionSession(other);
    assert.notEqual(otherSession.session, session.session);
    const request = { name: 'node-644', localFd: { ticket: ticket.ticket, offset: 4096, byteSize: 4096 } };
    await assertCode(rawCall(other, 'RegisterRegion', request, otherSession.session), 'NOT_FOUND');
    // A range past the object's end (this ticket is used up by the refusal).
    const past = await session.openShm(object.key);
    await assertCode(rawCall(client, 'RegisterRegion',
      { name: 'node-past', localFd: { ticket: past.ticket, offset: 4096, byteSize: 8192 } }, session.session), 'INVALID_ARGUMENT');
    const { region } = await rawCall(client, 'RegisterRegion', request, session.session);
    assert.equal(region.key, object.file);
    assert.equal(region.byteSize, 4096);
  } finally {
    other.close();
    object.remove();
  }
  assert.equal(await regions.unregisterRegion(client, 'node-644'), 1);
  await assertNothingRegistered();
});

test('closing the client ends its session, and its regions go with it', async () => {
  const other = dgmm.createClient(server.address);
  const shm = regions.createSharedMemoryRegion(4096);
  try {
    await shm.register(other, 'node-session-bound');
    assert.equal(shm.registered, true);
    const secret = shm.session.session;
    // Regions belong to the uid: this client's session sees it too.
    assert.equal((await regions.regionStatus(client, 'node-session-bound')).regions.length, 1);
    other.close();
    assert.equal(shm.registered, false);
    await eventually(async () => assertNothingRegistered());
    await assertCode(rawCall(client, 'GetRegionStatus', {}, secret), 'UNAUTHENTICATED');
    await assertCode(shm.multiply(other, new Float64Array(4), 2, 2, [1, 2]), 'FAILED_PRECONDITION');
    await assertCode(regions.regionStatus(other), 'CANCELLED');
    assert.equal(await shm.unregister(), false);
  } finally {
    other.close();
    await shm.close();
  }
});

test('the localSocket option: another path to the same socket, a wrong one, another server', async () => {
  const info = await dgmm.serverInfo(client);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dgmm-node-sock-'));
  const link = path.join(dir, 'seen-elsewhere.sock');
  fs.symlinkSync(info.limits.localSocket, link);
  const second = await startServer(['--threads=1', '--allow_regions']);
  const clients = [];
  const make = (localSocket) => {
    const c = dgmm.createClient(server.address, undefined, { localSocket });
    clients.push(c);
    return c;
  };
  const shm = regions.createSharedMemoryRegion(8 * 6);
  try {
    const viaLink = make(link);
    assert.equal((await regions.regionSession(viaLink)).path, link);
    await shm.register(viaLink, 'node-via-link');
    const a = randomArray(Float64Array, 6);
    const d = randomArray(Float64Array, 3);
    const { result } = await shm.multiply(viaLink, a, 2, 3, d, 'right');
    assertClose(result, reference(a, 2, 3, d, 'right', 'row'), 1e-15);
    await shm.unregister();

    await assertCode(regions.regionStatus(make(path.join(dir, 'missing.sock'))), 'UNAVAILABLE');
    const secondClient = dgmm.createClient(second.address);
    clients.push(secondClient);
    const secondInfo = await dgmm.serverInfo(secondClient);
    assert.notEqual(secondInfo.instanceId, info.instanceId);
    const wrong = make(secondInfo.limits.localSocket);
    await assertCode(regions.regionStatus(wrong), 'FAILED_PRECONDITION');
    // Refused sessions are not kept: the next call tries again (and fails again).
    await assertCode(regions.regionStatus(wrong), 'FAILED_PRECONDITION');
  } finally {
    await shm.close();
    for (const c of clients) c.close();
    await stopServer(second);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  await assertNothingRegistered();
});

test('bad inputs: names, keys, ranges, duplicates, regions off', async () => {
  assert.throws(() => regions.createSharedMemoryRegion(64, { key: '/../etc' }), /shared-memory key/);
  const shm = regions.createSharedMemoryRegion(4096);
  try {
    await assert.rejects(shm.register(client, 'a/b'), /region name/);
    await assert.rejects(shm.register(client, 'node-range', { offset: 4096, byteSize: 8 }), RangeError);
    await assert.rejects(shm.register(client, 'node-range', { byteSize: 8192 }), RangeError);
    await shm.register(client, 'node-dup');
    const other = regions.createSharedMemoryRegion(4096);
    try {
      await assertCode(other.register(client, 'node-dup'), 'ALREADY_EXISTS');
    } finally {
      await other.close();
    }
  } finally {
    await shm.close();
  }
  await assertNothingRegistered();

  const off = await startServer(['--threads=2']);
  const offClient = dgmm.createClient(off.address);
  const shm2 = regions.createSharedMemoryRegion(4096);
  try {
    const info = await dgmm.serverInfo(offClient);
    assert.equal(info.limits.regionsEnabled, false);
    assert.equal(info.limits.localSocket, '');
    await assertCode(shm2.register(offClient, 'x'), 'FAILED_PRECONDITION');
    await assertCode(rawCall(offClient, 'GetRegionStatus', {}), 'FAILED_PRECONDITION');
  } finally {
    await shm2.close();
    offClient.close();
    await stopServer(off);
  }
});
