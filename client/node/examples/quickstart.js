// Scale the columns, then the rows, of a matrix on a dgmm server.
// Usage: node client/node/examples/quickstart.js [HOST:PORT]   (after npm install ./client/node)
const { createClient, multiply, health, DgmmError } = require('../dgmm');

async function main(address = '127.0.0.1:50051') {
  const client = createClient(address);
  console.log('health:', await health(client)); // SERVING

  const rows = 1000;
  const cols = 300;
  const a = Float64Array.from({ length: rows * cols }, (_, i) => Math.sin(i)); // row-major
  const d = Float64Array.from({ length: cols }, (_, j) => 1 + j / cols);
  const c = await multiply(client, a, rows, cols, d, 'right'); // C = A·diag(d)
  for (let i = 0; i < rows * cols; i++) {
    if (c[i] !== a[i] * d[i % cols]) throw new Error(`wrong element ${i}`);
  }

  const f = Float32Array.from(a);
  const e = Float32Array.from({ length: rows }, (_, i) => (i % 7) - 3);
  const { result, stats } = await multiply(client, f, rows, cols, e, 'left', { returnStats: true }); // diag(e)·A
  console.log(`left, float32: C[999][0] = ${result[999 * cols]}, ran on ${stats.device} in ${stats.totalNs / 1e6} ms`);

  try {
    await multiply(client, a, rows, cols, d.subarray(0, 10), 'right'); // wrong diagonal length
  } catch (err) {
    if (!(err instanceof DgmmError)) throw err;
    console.log('rejected:', err.codeName, '-', err.details);
  }
  client.close();
}

main(process.argv[2]).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
