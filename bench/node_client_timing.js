'use strict';
// node_client_timing: times the Node client's multiply() (client/node/dgmm.js,
// the Node-API addon over the C++ client) on one N x N job, the Node side of bench/python_client_bench.py,
// with the interface of client/python/tools/cpp_client_timing.cc:
//
//   node bench/node_client_timing.js SERVER N REPEATS [WARMUP] [f32|f64]
//
// A fresh client (a fresh connection), a random row-major A (N x N) and d (N)
// in [-4, 4) made here, side right, the result written into one preallocated
// typed array (options.out) on every call, the client's default policy
// (unary or stream, auto stripes), as the C++ and Python sides do. Runs
// WARMUP + REPEATS calls; the first (a warm-up call) goes into an output
// poisoned with NaN and is checked element by element against a float64
// reference computed here (relative error <= 1e-6 for f32, 1e-15 for f64,
// as the C++ tool); the last REPEATS are timed. Prints one line:
// `{"n": N, "seconds": [t1, t2, ...]}`. Exits 1 on an RPC error, 2 on bad
// arguments, 3 when the first result is wrong.
//
// client/node's addon must be built (npm install ./client/node, or the
// repository build's dgmm_node target; client/node/README.md).

const path = require('node:path');
const { performance } = require('node:perf_hooks');

const dgmm = require(path.join(__dirname, '..', 'client', 'node', 'dgmm.js'));

function usage(message) {
  process.stderr.write(`node_client_timing: ${message}\n` +
    'usage: node bench/node_client_timing.js SERVER N REPEATS [WARMUP] [f32|f64]\n');
  process.exit(2);
}

// The first result against the float64 reference a[k] * d[col] (side right,
// row-major); returns the first wrong index or -1.
function firstWrong(a, d, c, n, tol) {
  for (let row = 0, k = 0; row < n; row++) {
    for (let col = 0; col < n; col++, k++) {
      const want = a[k] * d[col]; // JS numbers are float64.
      if (!(Math.abs(c[k] - want) <= tol * Math.abs(want))) return k;
    }
  }
  return -1;
}

async function main() {
  const argv = process.argv.slice(2);
  if (argv.length < 3) usage('too few arguments');
  const [server, nText, repeatsText, warmupText = '1', dtype = 'f32'] = argv;
  const n = Number(nText);
  const repeats = Number(repeatsText);
  const warmup = Number(warmupText);
  if (!(Number.isInteger(n) && n >= 1 && Number.isInteger(repeats) && repeats >= 1 &&
        Number.isInteger(warmup) && warmup >= 1 && (dtype === 'f32' || dtype === 'f64'))) {
    usage('N >= 1, REPEATS >= 1, WARMUP >= 1, f32 or f64');
  }
  const Ctor = dtype === 'f32' ? Float32Array : Float64Array;
  const tol = dtype === 'f32' ? 1e-6 : 1e-15;
  const a = new Ctor(n * n);
  const d = new Ctor(n);
  for (let k = 0; k < a.length; k++) a[k] = Math.random() * 8 - 4;
  for (let k = 0; k < d.length; k++) d[k] = Math.random() * 8 - 4;
  const c = new Ctor(a.length).fill(NaN); // Poisoned: the first call must write every element.

  const client = dgmm.createClient(server);
  const seconds = [];
  try {
    for (let i = 0; i < warmup + repeats; i++) {
      const start = performance.now();
      await dgmm.multiply(client, a, n, n, d, 'right', { out: c });
      const took = (performance.now() - start) / 1e3;
      if (i === 0) {
        const k = firstWrong(a, d, c, n, tol);
        if (k >= 0) {
          process.stderr.write(`node_client_timing: wrong result at (${Math.floor(k / n)}, ${k % n}): ` +
            `${c[k]} != ${a[k] * d[k % n]}\n`);
          return 3;
        }
      }
      if (i >= warmup) seconds.push(took);
    }
  } catch (err) {
    process.stderr.write(`node_client_timing: ${err && err.message || err}\n`);
    return 1;
  } finally {
    client.close();
  }
  process.stdout.write(`{"n": ${n}, "seconds": [${seconds.map((s) => s.toFixed(9)).join(', ')}]}\n`);
  return 0;
}

main().then((code) => { process.exitCode = code; }, (err) => {
  process.stderr.write(`node_client_timing: ${err && err.stack || err}\n`);
  process.exitCode = 1;
});
