'use strict';
// npm pack's prepack step (postpack: --clean removes them again): copies what the addon is built from -- proto/
// and client/cpp/ of the repository, and its LICENSE -- into core/ and
// LICENSE, so that the tarball builds on a machine without the repository
// (CMakeLists.txt builds from core/ when it is there). Both are ignored by git.
const fs = require('node:fs');
const path = require('node:path');

const PACKAGE = path.resolve(__dirname, '..');
const REPO = path.resolve(PACKAGE, '..', '..');
const CORE = path.join(PACKAGE, 'core');

// postpack: the copies go again once the tarball is made.
if (process.argv[2] === '--clean') {
  if (fs.existsSync(path.join(REPO, 'proto', 'CMakeLists.txt'))) {
    fs.rmSync(CORE, { recursive: true, force: true });
    fs.rmSync(path.join(PACKAGE, 'LICENSE'), { force: true });
  }
  process.exit(0);
}

if (!fs.existsSync(path.join(REPO, 'proto', 'CMakeLists.txt'))) {
  // Packing an unpacked tarball: core/ is already there.
  if (!fs.existsSync(path.join(CORE, 'proto', 'CMakeLists.txt'))) throw new Error('dgmm: neither the repository nor core/ is here');
  process.exit(0);
}
fs.rmSync(CORE, { recursive: true, force: true });
const skip = (src) => !/(^|\/)(build|node_modules)(\/|$)/.test(path.relative(REPO, src));
fs.cpSync(path.join(REPO, 'proto'), path.join(CORE, 'proto'), { recursive: true, filter: skip });
fs.cpSync(path.join(REPO, 'client', 'cpp'), path.join(CORE, 'client', 'cpp'), { recursive: true, filter: skip });
fs.copyFileSync(path.join(REPO, 'LICENSE'), path.join(PACKAGE, 'LICENSE'));
