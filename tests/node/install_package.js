'use strict';
// ctest's node_package fixture: the Node package as a user gets it. Puts the
// addon into client/node/build (for the conformance runner, which loads
// client/node), packs client/node with `npm pack` and installs the tarball
// into an empty project, offline, where the tests load it from
// (DGMM_NODE_PACKAGE). With DGMM_BUILD_DIR set, the package's install step
// copies the addon CMake built there instead of building its own.
//   node install_package.js PROJECT_DIR
const childProcess = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const REPO = path.resolve(__dirname, '..', '..');
const CLIENT = path.join(REPO, 'client', 'node');
const npm = process.env.DGMM_NPM || 'npm';

function run(command, args, cwd) {
  console.log(`# ${command} ${args.join(' ')}   (in ${cwd})`);
  const r = childProcess.spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 600000 });
  process.stdout.write(r.stdout || '');
  process.stderr.write(r.stderr || '');
  if (r.error && r.error.code === 'ENOENT') {
    console.log(`SKIP: ${command} not found`);
    process.exit(77);
  }
  if (r.status !== 0) throw new Error(`${command} ${args.join(' ')} failed with status ${r.status}`);
  return r.stdout;
}

const project = path.resolve(process.argv[2]);
fs.rmSync(project, { recursive: true, force: true });
fs.mkdirSync(project, { recursive: true });
run(process.execPath, [path.join(CLIENT, 'scripts', 'build.js')], CLIENT);
const packed = JSON.parse(run(npm, ['pack', '--json', '--pack-destination', project, CLIENT], project));
const tarball = path.join(project, packed[0].filename);
fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'dgmm-node-tests', private: true }));
run(npm, ['install', '--offline', '--no-audit', '--no-fund', tarball], project);
const installed = path.join(project, 'node_modules', 'dgmm-client');
for (const file of ['dgmm.js', 'regions.js', 'build/dgmm.node', 'examples/quickstart.js', 'LICENSE']) {
  if (!fs.existsSync(path.join(installed, file))) throw new Error(`the installed package lacks ${file}`);
}
console.log(`installed: ${installed}`);
