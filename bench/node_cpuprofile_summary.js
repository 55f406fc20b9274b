'use strict';
// Summarizes a V8 CPU profile (node --cpu-prof) by self time: the top
// functions, and the time per source file (node: internals, grpc-js,
// protobufjs, client/node/dgmm.js, the timing script, (garbage collector),
// (idle), (program)). For bench/results/python_client/README.md's account of
// where the Node client's time goes.
//
//   node --cpu-prof --cpu-prof-dir=/tmp/prof bench/node_client_timing.js SERVER N REPEATS WARMUP
//   node bench/node_cpuprofile_summary.js /tmp/prof/*.cpuprofile [TOP]

const fs = require('node:fs');

const [file, topText = '25'] = process.argv.slice(2);
if (!file) {
  process.stderr.write('usage: node bench/node_cpuprofile_summary.js PROFILE.cpuprofile [TOP]\n');
  process.exit(2);
}
const profile = JSON.parse(fs.readFileSync(file, 'utf8'));
const byId = new Map(profile.nodes.map((node) => [node.id, node]));
const self = new Map(); // node id -> microseconds
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i];
  self.set(id, (self.get(id) || 0) + (profile.timeDeltas[i] || 0));
}
const total = [...self.values()].reduce((s, t) => s + t, 0);

function group(url) {
  if (!url) return '';
  if (url.includes('@grpc/grpc-js')) return '@grpc/grpc-js';
  if (url.includes('protobufjs') || url.includes('@protobufjs')) return 'protobufjs';
  if (url.includes('client/node/dgmm.js')) return 'client/node/dgmm.js';
  if (url.includes('node_client_timing.js')) return 'bench/node_client_timing.js';
  if (url.startsWith('node:')) return url.replace(/^node:(internal\/)?/, 'node:').split('/').slice(0, 2).join('/');
  return url;
}

const fns = new Map();
const files = new Map();
for (const [id, us] of self) {
  const { functionName, url, lineNumber } = byId.get(id).callFrame;
  const g = group(url);
  const fn = `${functionName || '(anonymous)'} ${g}${url && lineNumber >= 0 ? `:${lineNumber + 1}` : ''}`;
  fns.set(fn, (fns.get(fn) || 0) + us);
  const f = g || functionName;
  files.set(f, (files.get(f) || 0) + us);
}
const line = (name, us) => `${(us / 1e3).toFixed(1).padStart(10)} ms ${(100 * us / total).toFixed(1).padStart(5)}%  ${name}`;
console.log(`# ${file}: ${(total / 1e3).toFixed(1)} ms sampled`);
console.log('# self time by file');
for (const [name, us] of [...files].sort((x, y) => y[1] - x[1]).slice(0, 15)) console.log(line(name, us));
console.log('# self time by function');
for (const [name, us] of [...fns].sort((x, y) => y[1] - x[1]).slice(0, Number(topText))) console.log(line(name, us));
