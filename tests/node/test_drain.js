'use strict';
// A server's drain never hangs a call of the Node client. A real
// dgmm-server (CPU backend) is kept busy by CLIENTS clients, each running
// CONCURRENT small jobs at a time back to back with a 60 s timeoutMs; it is
// sent SIGTERM and not restarted. Every call, in particular every call sent
// into the drain window (between the SIGTERM and the server's exit), must end
// with OK or UNAVAILABLE within the reconnect limit (the default
// retry.maxReconnectWaitMs, 5 s) plus 2 s: none may wait out its deadline.
// While the server drains it refuses jobs with UNAVAILABLE and the clients
// retry them; a retried attempt that met the server's exit used to be sent
// with waitForReady and could wait for a connection until its deadline. Half
// the clients retry every 1-4 ms (default maxReconnectWaitMs) so that many
// retried attempts meet the exit; ROUNDS rounds, each with a fresh server. A
// MultiplyStream call that never sends its header keeps the drain going for
// the server's whole shutdown grace (5 s). The one absolute time is the bound.
// Run by ctest (node_drain), or by hand:
//   DGMM_SERVER_BIN=build/service/dgmm-server node tests/node/test_drain.js

const assert = require('node:assert/strict');
const http2 = require('node:http2');

const { CLIENT_DIR, installDependencies, startServer, stopServer, random } = require('./support');

installDependencies();

const { test } = require('node:test');
const dgmm = require(CLIENT_DIR);

const CLIENTS = 4;
const CONCURRENT = 8; // calls at a time per client, on its connection
const ROUNDS = 2;
const TIMEOUT_MS = 60000;
const BOUND_MS = dgmm.DEFAULT_RETRY_POLICY.maxReconnectWaitMs + 2000;
const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One client running CONCURRENT loops of small jobs; every call recorded.
function startCaller(address, seed, stopped) {
  const eager = seed % 2 === 1;
  const client = dgmm.createClient(address, undefined,
    eager ? { retry: { maxAttempts: 64, initialBackoffMs: 1, maxBackoffMs: 4 } } : {});
  const next = random(seed);
  const a = Float32Array.from({ length: 256 }, next);
  const d = Float32Array.from({ length: 16 }, next);
  const caller = { calls: [], successes: 0 };
  caller.done = Promise.all(Array.from({ length: CONCURRENT }, async () => {
    while (!stopped()) {
      const start = now();
      let error = null;
      try {
        const c = await dgmm.multiply(client, a, 16, 16, d, 'right', { timeoutMs: TIMEOUT_MS });
        for (let k = 0; k < 256 && !error; k++) if (c[k] !== Math.fround(a[k] * d[k % 16])) error = 'wrong result';
      } catch (err) {
        error = err;
      }
      caller.calls.push({ start, end: now(), error });
      if (!error) caller.successes += 1;
    }
  })).finally(() => client.close());
  return caller;
}

async function runRound(round) {
  // No per-client queue limit, as in the C++ and Python drain tests.
  const server = await startServer(['--threads=2', '--max_queue=1024', '--max_queued_per_client=0']);
  let stop = false;
  const callers = Array.from({ length: CLIENTS }, (_, i) => startCaller(server.address, round * CLIENTS + i, () => stop));
  let term;
  let exited;
  let open;
  let holder;
  try {
    const warm = Date.now() + 30000;
    while (Math.min(...callers.map((c) => c.successes)) < 3 && Date.now() < warm) await sleep(10);
    assert.ok(Math.min(...callers.map((c) => c.successes)) >= 3, 'not every client ran 3 jobs before the SIGTERM');
    // The header-less stream that holds the drain open: a MultiplyStream
    // call, opened with Node's own HTTP/2, that never sends a message.
    holder = http2.connect(`http://${server.address}`);
    holder.on('error', () => {});
    open = holder.request({ ':method': 'POST', ':path': '/dgmm.v1.Dgmm/MultiplyStream',
      'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
    open.on('error', () => {});
    open.on('data', () => {});
    await sleep(100); // for its HEADERS to reach the server
    const gone = new Promise((r) => server.proc.once('exit', r));
    term = now();
    server.proc.kill('SIGTERM');
    await gone;
    exited = now();
    // Every call begun before the exit has ended by now unless it hangs; the
    // calls begun since (the server is gone) show that too.
    await sleep(BOUND_MS + 1000);
  } finally {
    stop = true;
    await Promise.all(callers.map((c) => c.done));
    if (open) open.close();
    if (holder) holder.close();
    await stopServer(server);
  }
  let inWindow = 0;
  let inWindowOk = 0;
  let afterExit = 0;
  let longest = { took: 0 };
  callers.forEach((caller, i) => {
    for (const call of caller.calls) {
      const took = call.end - call.start;
      if (took > longest.took) longest = { took, sent: call.start - term, error: call.error };
      const sentInWindow = call.start >= term && call.start < exited;
      inWindow += sentInWindow ? 1 : 0;
      inWindowOk += sentInWindow && !call.error ? 1 : 0;
      afterExit += call.start >= exited ? 1 : 0;
      const what = `client ${i}, sent ${(call.start - term).toFixed(0)} ms after the SIGTERM (the server exited after ` +
        `${(exited - term).toFixed(0)} ms), took ${took.toFixed(0)} ms: ${call.error || 'OK'}`;
      assert.ok(!call.error || (call.error instanceof dgmm.DgmmError && call.error.code === dgmm.status.UNAVAILABLE), what);
      assert.ok(took <= BOUND_MS, what);
      if (call.start >= exited) assert.ok(call.error, what);
    }
  });
  console.log(`# round ${round}: drain window ${(exited - term).toFixed(0)} ms; ${inWindow} calls sent into it ` +
    `(${inWindowOk} OK), ${afterExit} after the exit; longest call ${longest.took.toFixed(0)} ms ` +
    `(sent ${(longest.sent ?? 0).toFixed(0)} ms after the SIGTERM: ${longest.error || 'OK'})`);
  return inWindow;
}

test('drain: calls sent into a drain end within the reconnect limit', async () => {
  let inWindow = 0;
  for (let round = 0; round < ROUNDS; round++) inWindow += await runRound(round);
  // The window was exercised: calls were sent while the server drained.
  assert.ok(inWindow >= CLIENTS * CONCURRENT * ROUNDS, `${inWindow} calls sent into the drain windows`);
});
