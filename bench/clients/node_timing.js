'use strict';
// node_timing.js: times dgmm.multiply on one N x N float32 job from Node,
// the mirror of dgmm_cpp_client_timing (client/python/tools) and
// python_timing.py: the same job, the same output-array reuse, the same
// JSON line.
//
//   node node_timing.js PACKAGE_DIR SERVER N REPEATS [WARMUP]
//
// Prints {"n": N, "seconds": [...], "first": t0, "mode": M}. DGMM_SAME_HOST=0
// turns the same-host path off. Exits 1 on an RPC error, 3 when the first
// result differs from a float64 reference.
const [pkg, server, nArg, repeatsArg, warmupArg = '1'] = process.argv.slice(2);
const dgmm = require(pkg);

async function main() {
  const n = Number(nArg);
  const repeats = Number(repeatsArg);
  const warmup = Number(warmupArg);
  const a = new Float32Array(n * n);
  const d = new Float32Array(n);
  for (let i = 0; i < a.length; i++) a[i] = Math.random() * 8 - 4;
  for (let i = 0; i < n; i++) d[i] = Math.random() * 8 - 4;
  const c = new Float32Array(n * n).fill(NaN);
  const client = dgmm.createClient(server, undefined, { sameHost: process.env.DGMM_SAME_HOST !== '0' });
  const options = { out: c };
  const seconds = [];
  let first = 0;
  let mode = '';
  for (let i = 0; i < warmup + repeats; i++) {
    const start = process.hrtime.bigint();
    await dgmm.multiply(client, a, n, n, d, 'right', i === warmup + repeats - 1 ? { out: c, returnInfo: true } : options)
      .then((r) => { if (r.info) mode = r.info.mode + (r.info.processMemory ? ' process' : ''); });
    const s = Number(process.hrtime.bigint() - start) * 1e-9;
    if (i === 0) {
      first = s;
      for (let k = 0; k < a.length; k++) {
        const want = a[k] * d[k % n];
        if (!(Math.abs(c[k] - want) <= 1e-6 * Math.abs(want))) {
          console.error(`node_timing: wrong result at ${k}`);
          process.exit(3);
        }
      }
    }
    if (i >= warmup) seconds.push(s);
  }
  client.close();
  console.log(JSON.stringify({ n, seconds, first, mode }));
}

main().catch((err) => {
  console.error(`node_timing: ${err.message}`);
  process.exit(1);
});
