'use strict';
// The Node.js client's same-host path (client/node/same_host.js,
// docs/protocol.md section 9, rule 0) against real CPU dgmm-servers: with
// --allow_regions, jobs of 1 MiB and more go through the client's staging
// region (info.mode 'shm'), also from a server started with its defaults;
// without regions (--allow_regions=false), with sameHost: false, with a
// forced RPC or with a region budget smaller than the staging region, they
// go over the socket (info.socketReason says why when the path was tried).
// Ends with the warm job time at N=2000 float32, same-host vs socket. Run by
// ctest (test `node_same_host`), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_same_host.js
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
const sameHost = require(path.join(CLIENT_DIR, 'same_host.js'));
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

const RTOL = { Float32Array: 1e-6, Float64Array: 1e-15 };

// One job with fresh data into an output poisoned with NaN, checked against
// the float64 reference; resolves to its info.
async function checkedJob(client, Ctor, rows, cols, side, layout, options = {}) {
  const a = randomArray(Ctor, rows * cols);
  const d = randomArray(Ctor, side === 'right' ? cols : rows);
  const out = new Ctor(rows * cols).fill(NaN);
  const { result, stats, info } = await dgmm.multiply(client, a, rows, cols, d, side,
    { layout, out, returnInfo: true, ...options });
  assert.equal(result, out);
  assert.ok(stats, 'stats');
  assertClose(out, reference(a, rows, cols, d, side, layout), RTOL[Ctor.name]);
  return info;
}

let server;
let client;
before(async () => {
  server = await startServer(['--threads=2', '--allow_regions']);
  client = dgmm.createClient(server.address);
});
after(async () => {
  if (client) client.close();
  if (server) await stopServer(server);
});

test('every dtype, side and layout goes through memory', async () => {
  // 1.2 MB (float64) and 1.44 MB (float32) of matrix: at least 1 MiB.
  for (const [Ctor, rows, cols] of [[Float64Array, 500, 301], [Float32Array, 601, 600]]) {
    for (const side of ['right', 'left']) {
      for (const layout of ['row', 'col']) {
        const info = await checkedJob(client, Ctor, rows, cols, side, layout);
        assert.equal(info.mode, 'shm', `${Ctor.name} ${side} ${layout}: ${info.socketReason}`);
        assert.equal(info.socketReason, '');
        assert.equal(info.stats.length, 1);
      }
    }
  }
  // One staging region, reused: 2 MiB for the 1.44 MB jobs.
  const staging = sameHost.stagingOf(client);
  assert.equal(staging.byteSize, 2 * 1024 * 1024);
  const status = await regions.regionStatus(client, staging.name);
  assert.ok(status.regions[0].jobsTotal >= 4, String(status.regions[0].jobsTotal));
});

test('small jobs, sameHost: false and a forced RPC go over the socket, without a reason', async () => {
  let info = await checkedJob(client, Float32Array, 100, 100, 'right', 'row');
  assert.deepEqual([info.mode, info.socketReason], ['unary', '']);
  info = await checkedJob(client, Float64Array, 500, 301, 'left', 'col', { sameHost: false });
  assert.deepEqual([info.mode, info.socketReason], ['unary', '']);
  info = await checkedJob(client, Float32Array, 1200, 1000, 'right', 'row', { sameHost: false });
  assert.deepEqual([info.mode, info.socketReason], ['stream', '']);
  info = await checkedJob(client, Float32Array, 601, 600, 'right', 'row', { stream: true });
  assert.deepEqual([info.mode, info.socketReason], ['stream', '']);
  info = await checkedJob(client, Float32Array, 601, 600, 'left', 'col', { stream: false });
  assert.deepEqual([info.mode, info.socketReason], ['unary', '']);
  const off = dgmm.createClient(server.address, undefined, { sameHost: false });
  try {
    info = await checkedJob(off, Float32Array, 601, 600, 'right', 'row');
    assert.deepEqual([info.mode, info.socketReason], ['unary', '']);
    info = await checkedJob(off, Float32Array, 601, 600, 'right', 'row', { sameHost: true });
    assert.equal(info.mode, 'shm', info.socketReason);
  } finally {
    off.close();
  }
});

test('the staging region grows to the next power of two and is replaced, not added to', async () => {
  const own = dgmm.createClient(server.address);
  let previous = null;
  try {
    const sizes = [];
    const names = [];
    // float32 N x N: 1 MiB, 2.3 MB, 9 MB, 36 MB.
    for (const n of [512, 760, 1500, 3000]) {
      const info = await checkedJob(own, Float32Array, n, n, n % 2 ? 'left' : 'right', 'row');
      assert.equal(info.mode, 'shm', info.socketReason);
      const staging = sameHost.stagingOf(own);
      assert.notEqual(staging, previous);
      if (previous) assert.equal(previous.fd, null, 'the smaller staging object is closed');
      previous = staging;
      sizes.push(staging.byteSize);
      names.push(staging.name);
      const mine = (await regions.regionStatus(own)).regions.filter((r) => r.name === staging.name);
      assert.equal(mine.length, 1);
    }
    assert.deepEqual(sizes, [1, 4, 16, 64].map((m) => m * 1024 * 1024));
    // A smaller job reuses the large one.
    const info = await checkedJob(own, Float64Array, 700, 700, 'left', 'col');
    assert.equal(info.mode, 'shm', info.socketReason);
    assert.equal(sameHost.stagingOf(own), previous);
    // The smaller ones were unregistered: only the 64 MiB one is left of this client.
    const left = new Set((await regions.regionStatus(own)).regions.map((r) => r.name));
    assert.deepEqual(names.filter((name) => left.has(name)), [previous.name]);
  } finally {
    own.close();
  }
  // close() closes and unlinks the staging object.
  assert.equal(sameHost.stagingOf(own), null);
  assert.equal(previous.fd, null);
  assert.ok(!fs.existsSync(previous.path), previous.path);
});

test('concurrent jobs of one client share its staging region, one at a time', async () => {
  const infos = await Promise.all([0, 1, 2, 3].map((i) => checkedJob(client, i % 2 ? Float64Array : Float32Array,
    600 + i, 500, i < 2 ? 'right' : 'left', i % 2 ? 'row' : 'col')));
  for (const info of infos) assert.equal(info.mode, 'shm', info.socketReason);
});

test('a region job the socket could not do better fails with its own error', async () => {
  const a = randomArray(Float32Array, 601 * 600);
  await assert.rejects(dgmm.multiply(client, a, 601, 600, randomArray(Float32Array, 600), 'right', { backend: 'cuda-kernel' }),
    (err) => {
      assert.equal(err.codeName, 'INVALID_ARGUMENT', err.message);
      assert.equal(err.info.mode, 'shm');
      return true;
    });
  // The staging region is still good.
  const info = await checkedJob(client, Float32Array, 601, 600, 'right', 'row');
  assert.equal(info.mode, 'shm', info.socketReason);
});

test('a server started with its defaults: memory, without a flag on either side', async () => {
  const plain = await startServer(['--threads=2'], { serverDefaults: true });
  const c = dgmm.createClient(plain.address);
  try {
    for (const [Ctor, rows, cols, side, layout] of [[Float32Array, 601, 600, 'right', 'row'],
      [Float64Array, 500, 301, 'left', 'col']]) {
      const info = await checkedJob(c, Ctor, rows, cols, side, layout);
      assert.equal(info.mode, 'shm', info.socketReason);
      assert.equal(info.socketReason, '');
    }
  } finally {
    c.close();
    await stopServer(plain);
  }
});

test('a server with --allow_regions=false: the socket, with the reason, remembered', async () => {
  const plain = await startServer(['--threads=2']);
  // Counts GetServerInfo calls: the session check is made once, then remembered.
  let infoCalls = 0;
  const counter = (options, nextCall) => {
    if (options.method_definition.path.endsWith('/GetServerInfo')) infoCalls += 1;
    return new dgmm.grpc.InterceptingCall(nextCall(options));
  };
  const c = dgmm.createClient(plain.address, undefined, { channelOptions: { interceptors: [counter] } });
  try {
    for (const [Ctor, rows, cols, side, layout] of [[Float32Array, 601, 600, 'right', 'row'],
      [Float64Array, 500, 301, 'left', 'col'], [Float32Array, 1200, 1000, 'left', 'row']]) {
      const info = await checkedJob(c, Ctor, rows, cols, side, layout);
      assert.notEqual(info.mode, 'shm');
      assert.match(info.socketReason, /^FAILED_PRECONDITION: .*regions are off/);
    }
    assert.equal(sameHost.stagingOf(c), null);
    assert.equal(infoCalls, 1);
  } finally {
    c.close();
    await stopServer(plain);
  }
});

test('a region budget smaller than the staging region: the socket, RESOURCE_EXHAUSTED', async () => {
  const small = await startServer(['--threads=2', '--allow_regions', '--region_memory_budget=65536']);
  const c = dgmm.createClient(small.address);
  try {
    for (const side of ['right', 'left']) {
      const info = await checkedJob(c, Float32Array, 601, 600, side, 'row');
      assert.equal(info.mode, 'unary');
      assert.match(info.socketReason, /^RESOURCE_EXHAUSTED: /);
    }
    assert.equal(sameHost.stagingOf(c), null);
    // Regions themselves still work within the budget: the path is tried again per job.
    const status = await regions.regionStatus(c);
    assert.equal(status.registeredBytes, 0);
  } finally {
    c.close();
    await stopServer(small);
  }
});

// A server of another uid cannot open this client's 0600 object (open_shm's
// ownership rule): PERMISSION_DENIED, the socket, remembered. Needs root
// (to start the server as nobody) and setpriv.
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));
test('a server of another uid: the socket, PERMISSION_DENIED', {
  skip: process.getuid() !== 0 || !SETPRIV ? 'needs root and setpriv' : false,
}, async () => {
  const childProcess = require('node:child_process');
  const dir = fs.mkdtempSync('/tmp/dgmm-node-uid-');
  fs.chmodSync(dir, 0o777);
  const portFile = path.join(dir, 'port');
  // A copy uid 65534 can run, wherever the build tree is (under /root, say).
  const server = path.join(dir, 'dgmm-server');
  fs.copyFileSync(process.env.DGMM_SERVER_BIN, server);
  fs.chmodSync(server, 0o755);
  const proc = childProcess.spawn(SETPRIV, ['--reuid=65534', '--regid=65534', '--clear-groups',
    server, '--listen=127.0.0.1:0', `--port_file=${portFile}`, '--backend=cpu',
    '--allow_regions'], { stdio: 'ignore' });
  const exited = new Promise((r) => proc.once('exit', r));
  let c;
  try {
    const deadline = Date.now() + 30000;
    while (!(fs.existsSync(portFile) && fs.readFileSync(portFile, 'utf8').endsWith('\n'))) {
      assert.ok(Date.now() < deadline && proc.exitCode === null, 'the server as uid 65534 did not start');
      await new Promise((r) => setTimeout(r, 50));
    }
    c = dgmm.createClient(`127.0.0.1:${fs.readFileSync(portFile, 'utf8').trim()}`);
    for (const layout of ['row', 'col']) {
      const info = await checkedJob(c, Float32Array, 601, 600, 'left', layout);
      assert.equal(info.mode, 'unary');
      assert.match(info.socketReason, /^PERMISSION_DENIED: /);
    }
    assert.equal(sameHost.stagingOf(c), null);
  } finally {
    if (c) c.close();
    proc.kill('SIGTERM');
    await exited;
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('warm job time at N=2000 float32: same-host vs socket', async () => {
  const n = 2000;
  const a = randomArray(Float32Array, n * n);
  const d = randomArray(Float32Array, n);
  const out = new Float32Array(n * n);
  const median = async (sameHostOption) => {
    const times = [];
    for (let i = 0; i < 12; i++) {
      const t0 = process.hrtime.bigint();
      const { info } = await dgmm.multiply(client, a, n, n, d, 'right', { out, returnInfo: true, sameHost: sameHostOption });
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      assert.equal(info.mode, sameHostOption ? 'shm' : 'stream');
      if (i >= 2) times.push(ms); // Two warm-up jobs.
    }
    times.sort((x, y) => x - y);
    return times[times.length >> 1];
  };
  const shm = await median(true);
  const socket = await median(false);
  assertClose(out, reference(a, n, n, d, 'right', 'row'), 1e-6);
  console.log(`# warm job, N=2000 float32 right row-major, median of 10: same-host ${shm.toFixed(1)} ms, ` +
    `socket ${socket.toFixed(1)} ms (${(socket / shm).toFixed(1)}x)`);
});
