'use strict';
// The package's install step: puts the addon at build/dgmm.node.
//  - DGMM_BUILD_DIR=<a build of the repository> (scripts/build.sh): copies
//    <build dir>/node/dgmm.node, built there by CMake (tests/node);
//  - otherwise configures and builds CMakeLists.txt next to this folder's
//    parent (dgmm_proto, dgmm_client and the addon only) in build/cmake, with
//    ccache when it is installed, against Node's headers next to the running
//    node and Debian's gRPC, Protobuf and Abseil (scripts/install-deps.sh
//    compile). Needs no network.
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const PACKAGE = path.resolve(__dirname, '..');
const OUT = path.join(PACKAGE, 'build', 'dgmm.node');

function run(command, args) {
  console.log(`dgmm: ${command} ${args.join(' ')}`);
  const r = childProcess.spawnSync(command, args, { stdio: 'inherit' });
  if (r.error) throw new Error(`dgmm: ${command} did not run (${r.error.message}); install cmake and a C++ compiler (scripts/install-deps.sh compile)`);
  if (r.status !== 0) throw new Error(`dgmm: ${command} failed with status ${r.status}`);
}

function has(command) {
  return childProcess.spawnSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' }).status === 0;
}

function main() {
  fs.mkdirSync(path.dirname(OUT), { recursive: true });
  const buildDir = process.env.DGMM_BUILD_DIR;
  if (buildDir) {
    const built = path.resolve(buildDir, 'node', 'dgmm.node');
    if (!fs.existsSync(built)) throw new Error(`dgmm: DGMM_BUILD_DIR=${buildDir} has no node/dgmm.node; build the target dgmm_node there`);
    fs.copyFileSync(built, OUT);
    console.log(`dgmm: ${OUT} from ${built}`);
    return;
  }
  const include = path.resolve(process.execPath, '..', '..', 'include', 'node');
  if (!fs.existsSync(path.join(include, 'node_api.h'))) throw new Error(`dgmm: no node_api.h in ${include}: install Node.js with its headers`);
  const cmakeDir = process.env.DGMM_CMAKE_BUILD_DIR || path.join(PACKAGE, 'build', 'cmake');
  const configure = ['-S', PACKAGE, '-B', cmakeDir, '-DCMAKE_BUILD_TYPE=Release', `-DDGMM_NODE_INCLUDE_DIR=${include}`,
    `-DDGMM_NODE_OUTPUT_DIR=${path.dirname(OUT)}`];
  if (has('ccache')) configure.push('-DCMAKE_CXX_COMPILER_LAUNCHER=ccache');
  run('cmake', configure);
  const jobs = process.env.JOBS || String(os.availableParallelism ? os.availableParallelism() : os.cpus().length);
  run('cmake', ['--build', cmakeDir, '-j', jobs, '--target', 'dgmm_node']);
  if (!fs.existsSync(OUT)) throw new Error(`dgmm: the build made no ${OUT}`);
}

try {
  main();
} catch (err) {
  console.error(err.message);
  process.exit(1);
}
