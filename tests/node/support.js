'use strict';
// Shared by the Node client tests: dependencies, a real dgmm-server on an
// ephemeral loopback port, seeded data, a float64 reference, and a TCP proxy
// that counts (and can reset) connections.

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

// The seeded generator of uniform values in [-4, 4) (tests/support/random.js).
const { random } = require('../support/random.js');

const REPO = path.resolve(__dirname, '..', '..');
// The package under test: the one node_package installed from its tarball
// (DGMM_NODE_PACKAGE, set by ctest), else client/node itself.
const CLIENT_DIR = process.env.DGMM_NODE_PACKAGE || path.join(REPO, 'client', 'node');
const SKIP = 77;

function skip(reason) {
  console.log(`SKIP: ${reason}`);
  process.exit(SKIP);
}

// Skips (77) unless the package's addon is built.
function installDependencies() {
  if (!fs.existsSync(path.join(CLIENT_DIR, 'build', 'dgmm.node'))) {
    skip(`${CLIENT_DIR} has no build/dgmm.node: run ctest's node_package fixture or npm install there`);
  }
}

// Starts dgmm-server on an ephemeral loopback port; resolves once it has
// written the port. --allow_regions=false is added unless extraFlags name
// --allow_regions: the server's default is on, and a client on this host
// then takes the same-host path, so a test of the gRPC socket gets the
// socket unless it asks for regions; { serverDefaults: true } adds nothing.
async function startServer(extraFlags = [], { serverDefaults = false } = {}) {
  if (!serverDefaults &&
      !extraFlags.some((f) => f.startsWith('--allow_regions') || f.startsWith('--noallow_regions'))) {
    extraFlags = ['--allow_regions=false', ...extraFlags];
  }
  const binary = process.env.DGMM_SERVER_BIN;
  if (!binary || !fs.existsSync(binary)) throw new Error(`set DGMM_SERVER_BIN to the built dgmm-server (got ${binary})`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dgmm-node-test-'));
  const portFile = path.join(dir, 'port');
  const log = fs.openSync(path.join(dir, 'server.log'), 'w');
  const proc = childProcess.spawn(binary, ['--listen=127.0.0.1:0', `--port_file=${portFile}`, '--backend=cpu', ...extraFlags],
    { stdio: ['ignore', log, log] });
  const readLog = () => fs.readFileSync(path.join(dir, 'server.log'), 'utf8');
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`dgmm-server exited with ${proc.exitCode}:\n${readLog()}`);
    if (fs.existsSync(portFile)) {
      const text = fs.readFileSync(portFile, 'utf8');
      if (text.endsWith('\n')) return { proc, dir, address: `127.0.0.1:${text.trim()}`, port: Number(text) };
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  proc.kill('SIGKILL');
  throw new Error(`dgmm-server did not write its port within 30 s:\n${readLog()}`);
}

async function stopServer(server) {
  if (server.proc.exitCode === null) {
    const exited = new Promise((r) => server.proc.once('exit', r));
    server.proc.kill('SIGTERM');
    const timer = setTimeout(() => server.proc.kill('SIGKILL'), 15000);
    await exited;
    clearTimeout(timer);
  }
  fs.rmSync(server.dir, { recursive: true, force: true });
}

// C in float64, independently of the server, for either layout.
function reference(a, rows, cols, d, side, layout) {
  const c = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      const k = layout === 'col' ? j * rows + i : i * cols + j;
      c[k] = a[k] * (side === 'right' ? d[j] : d[i]);
    }
  }
  return c;
}

function assertClose(actual, expected, rtol) {
  assert.equal(actual.length, expected.length);
  for (let k = 0; k < expected.length; k++) {
    if (!(Math.abs(actual[k] - expected[k]) <= rtol * Math.abs(expected[k]))) {
      assert.fail(`element ${k}: ${actual[k]} != ${expected[k]} (rtol ${rtol})`);
    }
  }
}

// A loopback TCP proxy to 127.0.0.1:upstreamPort that counts connections.
// The first `resets` connections are reset (RST both ways) once
// resetAfterBytes went client->server and resetAfterResultBytes
// server->client on them.
async function startProxy(upstreamPort, { resets = 0, resetAfterBytes = 0, resetAfterResultBytes = 0 } = {}) {
  const proxy = { connections: 0, resetsDone: 0, sockets: new Set() };
  const server = net.createServer((client) => {
    const index = proxy.connections++;
    const upstream = net.connect(upstreamPort, '127.0.0.1');
    proxy.sockets.add(client);
    proxy.sockets.add(upstream);
    let sent = 0;
    let returned = 0;
    const armed = index < resets;
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    const end = () => { client.destroy(); upstream.destroy(); };
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
    upstream.on('data', (data) => { returned += data.length; client.write(data); });
    client.on('data', (data) => {
      if (armed && sent + data.length >= resetAfterBytes && returned >= resetAfterResultBytes) {
        proxy.resetsDone += 1;
        client.resetAndDestroy();
        upstream.resetAndDestroy();
        return;
      }
      sent += data.length;
      upstream.write(data);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy.port = server.address().port;
  proxy.address = `127.0.0.1:${proxy.port}`;
  proxy.close = () => new Promise((resolve) => {
    for (const s of proxy.sockets) s.destroy();
    server.close(() => resolve());
  });
  return proxy;
}

// Stops `server` with SIGSTOP and waits until every one of its threads is
// stopped (the signal takes effect asynchronously).
async function stopProcess(server) {
  server.proc.kill('SIGSTOP');
  const pid = server.proc.pid;
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    const states = fs.readdirSync(`/proc/${pid}/task`).map((tid) =>
      fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(')').pop().trim().split(' ')[0]);
    if (states.every((s) => s === 'T')) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`process ${pid} did not stop`);
}

module.exports = {
  stopProcess,
  REPO, CLIENT_DIR, installDependencies, startServer, stopServer, random, reference, assertClose, startProxy,
};
