'use strict';
// W3C trace context through the Node client (docs/protocol.md "Trace
// context"): multiply's { traceparent, tracestate } reaches every part's
// stats (a striped job's parts share the trace id) and the server's job
// lines; without one the core makes a new valid traceparent per job
// (info.traceparent); multiplyBatch carries it to every job; an invalid
// one is INVALID_ARGUMENT before any call.
// Run by ctest (test `node_trace`), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_trace.js

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const {
  CLIENT_DIR, installDependencies, startServer, stopServer, random, reference, assertClose,
} = require('./support');

installDependencies();

const { test, before, after } = require('node:test');
const dgmm = require(CLIENT_DIR);

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT = '00f067aa0ba902b7';
const TRACEPARENT = `00-${TRACE}-${PARENT}-01`;
const TRACEPARENT_RE = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

let server;
let client;
before(async () => {
  server = await startServer(['--threads=2']);
  client = dgmm.createClient(server.address);
});
after(async () => {
  if (client) client.close();
  if (server) await stopServer(server);
});

const serverLog = () => fs.readFileSync(path.join(server.dir, 'server.log'), 'utf8');

async function logHas(text) {
  for (let i = 0; i < 100; i++) {
    if (serverLog().includes(text)) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

function operands(rows, cols, seed) {
  const next = random(seed);
  return { a: Float32Array.from({ length: rows * cols }, next), d: Float32Array.from({ length: cols }, next) };
}

test('a given traceparent reaches every part of a striped job', async () => {
  const { a, d } = operands(64, 16, 1);
  const { result, info } = await dgmm.multiply(client, a, 64, 16, d, 'right',
    { stripes: 4, returnInfo: true, traceparent: TRACEPARENT, tracestate: 'congo=t61rcWkgMzE' });
  assertClose(result, reference(a, 64, 16, d, 'right', 'row'), 1e-6);
  assert.equal(info.traceparent, TRACEPARENT);
  assert.equal(info.stats.length, 4);
  const spans = new Set();
  for (const part of info.stats) {
    assert.equal(part.traceId, TRACE);
    assert.equal(part.parentSpanId, PARENT);
    assert.match(part.spanId, /^[0-9a-f]{16}$/);
    spans.add(part.spanId);
    assert.ok(await logHas(`(4 parts): completed; method=MultiplySmall client=127.0.0.1 trace=${TRACE} parent=${PARENT} span=${part.spanId}`),
      serverLog());
  }
  assert.equal(spans.size, 4);
});

test('without one, the client makes a fresh traceparent per job', async () => {
  const { a, d } = operands(4, 4, 2);
  const traces = new Set();
  for (const stream of [undefined, true]) {
    const { info } = await dgmm.multiply(client, a, 4, 4, d, 'right', { stream, returnInfo: true });
    const m = TRACEPARENT_RE.exec(info.traceparent);
    assert.ok(m, info.traceparent);
    assert.notEqual(m[1], '0'.repeat(32));
    assert.equal(m[3], '00');
    assert.equal(info.stats[0].traceId, m[1]);
    assert.equal(info.stats[0].parentSpanId, m[2]);
    traces.add(m[1]);
  }
  assert.equal(traces.size, 2);
});

test('multiplyBatch carries it to every job', async () => {
  const jobs = [1, 2, 3].map((seed) => ({ ...operands(2, 3, 10 + seed), rows: 2, cols: 3 }));
  const done = await dgmm.multiplyBatch(client, jobs.map((j) => ({ a: j.a, rows: 2, cols: 3, diag: j.d })),
    { traceparent: TRACEPARENT });
  assert.equal(done.length, 3);
  for (const entry of done) {
    assert.equal(entry.stats.traceId, TRACE);
    assert.equal(entry.stats.parentSpanId, PARENT);
  }
});

test('an invalid traceparent, or a tracestate alone, is INVALID_ARGUMENT before any call', async () => {
  const { a, d } = operands(2, 2, 3);
  for (const bad of [`00-${TRACE.toUpperCase()}-${PARENT}-01`, `ff-${TRACE}-${PARENT}-01`, 'nonsense']) {
    await assert.rejects(dgmm.multiply(client, a, 2, 2, d, 'right', { traceparent: bad }),
      (err) => err instanceof dgmm.DgmmError && err.codeName === 'INVALID_ARGUMENT');
  }
  await assert.rejects(dgmm.multiply(client, a, 2, 2, d, 'right', { tracestate: 'a=1' }),
    (err) => err instanceof dgmm.DgmmError && err.codeName === 'INVALID_ARGUMENT');
  await assert.rejects(dgmm.multiply(client, a, 2, 2, d, 'right', { traceparent: 42 }), TypeError);
});
