'use strict';
// The Node package's same-host path -- the C++ core's (docs/protocol.md
// section 9, rule 0) -- against real CPU dgmm-servers: with regions on, jobs
// of 1 MiB and more go through memory (info.mode 'shm'): a server of this
// uid reads A from and writes C into the caller's typed arrays (process
// memory, info.processMemory), a server of another uid gets a staging memfd
// passed by descriptor; also from a server started with its defaults.
// Without regions, with sameHost: false, with a forced RPC or with a region
// budget smaller than the staging region, they go over the socket
// (info.socketReason says why when the path was tried). An AbortSignal ends
// a same-host job whose region call a stopped server holds. Ends with the warm
// job time at N=2000 float32, same-host vs socket. Run by ctest (test
// `node_same_host`), or by hand after `npm install` in client/node:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_same_host.js

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const {
  CLIENT_DIR, installDependencies, startServer, stopServer, stopProcess, random, reference, assertClose,
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
  // A server of this uid reads and writes the caller's arrays: no staging region.
  const { info } = await dgmm.multiply(client, new Float32Array(601 * 600), 601, 600, new Float32Array(600), 'right',
    { returnInfo: true });
  assert.equal(info.processMemory, true);
  assert.deepEqual((await regions.regionStatus(client)).regions, []);
});

test('with processMemory off, one staging memfd region of the client carries the jobs, reused', async () => {
  const staged = dgmm.createClient(server.address, undefined, { processMemory: false });
  try {
    for (const [Ctor, rows, cols, side] of [[Float32Array, 601, 600, 'right'], [Float64Array, 500, 301, 'left'],
      [Float32Array, 601, 600, 'left']]) {
      const info = await checkedJob(staged, Ctor, rows, cols, side, 'col');
      assert.equal(info.mode, 'shm', info.socketReason);
      assert.equal(info.processMemory, false);
    }
    const status = await regions.regionStatus(staged);
    assert.equal(status.regions.length, 1);
    assert.ok(status.regions[0].jobsTotal >= 3, String(status.regions[0].jobsTotal));
  } finally {
    staged.close();
  }
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

test('concurrent jobs of one client all go through memory', async () => {
  const infos = await Promise.all([0, 1, 2, 3].map((i) => checkedJob(client, i % 2 ? Float64Array : Float32Array,
    600 + i, 500, i < 2 ? 'right' : 'left', i % 2 ? 'row' : 'col')));
  for (const info of infos) assert.equal(info.mode, 'shm', info.socketReason);
});

test('a region job the socket could not do better fails with its own error', async () => {
  const a = randomArray(Float32Array, 601 * 600);
  await assert.rejects(dgmm.multiply(client, a, 601, 600, randomArray(Float32Array, 600), 'right', { backend: 'cuda-kernel' }),
    (err) => {
      assert.equal(err.codeName, 'INVALID_ARGUMENT', err.message);
      return true;
    });
  // The staging region is still good.
  const info = await checkedJob(client, Float32Array, 601, 600, 'right', 'row');
  assert.equal(info.mode, 'shm', info.socketReason);
});

test('an AbortSignal ends a same-host job within 100 ms, its region call in flight', async () => {
  // A stopped server holds the job's region call (its session is open from
  // a first job): only the abort can end it.
  const held = await startServer(['--threads=2', '--allow_regions']);
  try {
    for (const processMemory of [true, false]) {
      const c = dgmm.createClient(held.address, undefined, { processMemory });
      try {
        const first = await checkedJob(c, Float32Array, 601, 600, 'right', 'row');
        assert.equal(first.mode, 'shm', first.socketReason);
        assert.equal(first.processMemory, processMemory);
        await stopProcess(held);
        const controller = new AbortController();
        const job = dgmm.multiply(c, randomArray(Float32Array, 601 * 600), 601, 600,
          randomArray(Float32Array, 600), 'right', { signal: controller.signal });
        await new Promise((r) => setTimeout(r, 200));
        const start = performance.now();
        controller.abort();
        await assert.rejects(job, (err) => {
          assert.equal(err.codeName, 'CANCELLED', err.message);
          return true;
        });
        const ms = performance.now() - start;
        assert.ok(ms < 100, `processMemory ${processMemory}: cancelled after ${ms.toFixed(1)} ms`);
      } finally {
        held.proc.kill('SIGCONT');
        c.close();
      }
    }
  } finally {
    await stopServer(held);
  }
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

test('a server with --allow_regions=false: the socket, with the reason', async () => {
  const plain = await startServer(['--threads=2']);
  const c = dgmm.createClient(plain.address);
  try {
    for (const [Ctor, rows, cols, side, layout] of [[Float32Array, 601, 600, 'right', 'row'],
      [Float64Array, 500, 301, 'left', 'col'], [Float32Array, 1200, 1000, 'left', 'row']]) {
      const info = await checkedJob(c, Ctor, rows, cols, side, layout);
      assert.notEqual(info.mode, 'shm');
      assert.match(info.socketReason, /regions/);
    }
  } finally {
    c.close();
    await stopServer(plain);
  }
});

test('a region budget smaller than the staging region: the socket, RESOURCE_EXHAUSTED', async () => {
  const small = await startServer(['--threads=2', '--allow_regions', '--region_memory_budget=65536']);
  const c = dgmm.createClient(small.address, undefined, { processMemory: false });
  try {
    for (const side of ['right', 'left']) {
      const info = await checkedJob(c, Float32Array, 601, 600, side, 'row');
      assert.equal(info.mode, 'unary');
      assert.match(info.socketReason, /^RESOURCE_EXHAUSTED: /);
    }
    // Regions themselves still work within the budget: the path is tried again per job.
    const status = await regions.regionStatus(c);
    assert.equal(status.registeredBytes, 0);
  } finally {
    c.close();
    await stopServer(small);
  }
});

// A server of another uid cannot read this process's memory, but maps the
// staging memfd the client passes by descriptor: memory still, no
// open_shm by name. Needs root (to start the server as nobody) and setpriv.
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));
test('a server of another uid: memory, through a staging region passed by descriptor', {
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
      assert.equal(info.mode, 'shm', info.socketReason);
      assert.equal(info.processMemory, false);
    }
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
