'use strict';
// Shared-memory regions for the Node.js client (docs/protocol.md "Regions"),
// without a native addon: Node cannot map memory, but a POSIX shared-memory
// object on Linux is a file in /dev/shm (glibc's shm_open(key) opens
// /dev/shm/<key>), so this module creates that file, writes the matrix into
// it with one pwrite, has the server compute in it, and reads the result
// back with one pread. The object's pages are the very memory the server maps
// (and pins on a GPU server): no matrix byte crosses the socket and nothing
// is serialized, but the client makes two kernel copies per job (in and out)
// that a mapping would avoid. CUDA IPC is not offered: it needs the CUDA
// runtime in this process, i.e. a native addon.
//
//   const dgmm = require('./dgmm');
//   const regions = require('./regions');
//   const client = dgmm.createClient('127.0.0.1:50051');
//   const shm = regions.createSharedMemoryRegion(rows * cols * 8);
//   await shm.register(client, 'work');
//   const { result, stats } = await shm.multiply(client, a, rows, cols, d, 'right');
//   await shm.close();   // unregisters, closes and unlinks the object
//
// The server must run with --allow_regions on this host. Region calls are
// not retried (a job in place must not run twice).

const crypto = require('node:crypto');
const fs = require('node:fs');
const { DgmmError, describeJob } = require('./dgmm');

const SHM_DIR = '/dev/shm';
const KEY = /^\/[A-Za-z0-9._-]{1,200}$/;
const NAME = /^[A-Za-z0-9._-]{1,64}$/;

function checkName(name) {
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new RangeError(`dgmm: a region name is 1-64 characters of [A-Za-z0-9._-], got ${JSON.stringify(name)}`);
  }
  return name;
}

function checkKey(key) {
  if (typeof key !== 'string' || !KEY.test(key) || key === '/.' || key === '/..') {
    throw new RangeError(`dgmm: a shared-memory key is "/" then 1-200 characters of [A-Za-z0-9._-], got ${JSON.stringify(key)}`);
  }
  return key;
}

// One unary region RPC on the dgmm client's channel; rejects with DgmmError.
function call(client, method, request, options = {}) {
  const deadline = options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
  return new Promise((resolve, reject) => {
    client[method](request, { deadline },
      (err, response) => (err ? reject(DgmmError.fromServiceError(err)) : resolve(response)));
  });
}

// RegionStatus of the client's regions (or the one named), and the bytes all
// clients registered against the budget: GetRegionStatusResponse.
function regionStatus(client, name = '', options = {}) {
  return call(client, 'GetRegionStatus', { name }, options);
}

// Unregisters one region by name, or every region of this client ('').
// Resolves to how many were unregistered.
async function unregisterRegion(client, name = '', options = {}) {
  return (await call(client, 'UnregisterRegion', { name }, options)).unregistered;
}

// The raw job: header {rows, cols, dtype, layout, side, backend, diagonal},
// refs {name, offset}. Resolves to JobStats.
async function multiplyRegion(client, { header, matrix, result, diagonal }, options = {}) {
  const request = { header, matrix, result };
  if (diagonal) request.diagonal = diagonal;
  return (await call(client, 'MultiplyRegion', request, options)).stats;
}

// A POSIX shared-memory object this process creates (owner read/write only)
// and sizes. key: "/" + 1-200 of [A-Za-z0-9._-]; default a fresh
// "/dgmm-node-<pid>-<random>". It is unlinked by close() and, failing that,
// when the process exits normally.
class SharedMemoryRegion {
  constructor(byteSize, key) {
    if (!Number.isSafeInteger(byteSize) || byteSize <= 0) throw new RangeError('dgmm: byteSize must be a positive integer');
    this.key = checkKey(key ?? `/dgmm-node-${process.pid}-${crypto.randomBytes(6).toString('hex')}`);
    this.path = SHM_DIR + this.key;
    this.byteSize = byteSize;
    this.fd = fs.openSync(this.path, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600);
    this.client = null;
    this.name = null;
    this.status = null;
    this.unlinkAtExit = () => { try { fs.unlinkSync(this.path); } catch { /* gone already */ } };
    process.once('exit', this.unlinkAtExit);
    try {
      fs.ftruncateSync(this.fd, byteSize);
    } catch (err) {
      this.closeFile();
      throw err;
    }
  }

  // Registers bytes [offset, offset + byteSize) of the object (default: all)
  // with `client` under `name`; resolves to the server's RegionStatus.
  async register(client, name, { offset = 0, byteSize = this.byteSize - offset, timeoutMs } = {}) {
    checkName(name);
    if (this.client) throw new Error(`dgmm: region is already registered as ${this.name}`);
    const response = await call(client, 'RegisterRegion',
      { name, systemShm: { key: this.key, offset, byteSize } }, { timeoutMs });
    Object.assign(this, { client, name, status: response.region, registeredOffset: offset });
    return response.region;
  }

  async unregister(options = {}) {
    if (!this.client) return false;
    const { client, name } = this;
    this.client = this.name = null;
    try {
      return (await unregisterRegion(client, name, options)) > 0;
    } catch (err) {
      if (err instanceof DgmmError && err.codeName === 'NOT_FOUND') return false;
      throw err;
    }
  }

  // Copies a typed array into the object at byte `offset` (one pwrite).
  write(typed, offset = 0) {
    this.checkRange(offset, typed.byteLength);
    const buffer = Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength);
    for (let done = 0; done < buffer.length;) {
      done += fs.writeSync(this.fd, buffer, done, buffer.length - done, offset + done);
    }
  }

  // Copies bytes at `offset` of the object into a typed array (one pread).
  read(typed, offset = 0) {
    this.checkRange(offset, typed.byteLength);
    const buffer = Buffer.from(typed.buffer, typed.byteOffset, typed.byteLength);
    for (let done = 0; done < buffer.length;) {
      const n = fs.readSync(this.fd, buffer, done, buffer.length - done, offset + done);
      if (n === 0) throw new Error(`dgmm: ${this.path} ends before ${offset + buffer.length} bytes`);
      done += n;
    }
    return typed;
  }

  // A RegionRef `offset` bytes into the registered range.
  ref(offset = 0) {
    if (!this.client) throw new Error('dgmm: region is not registered');
    return { name: this.name, offset };
  }

  // C = A·diag(d) (side 'right') or diag(d)·A ('left') through this
  // registered region: A (Float32Array or Float64Array, rows x cols, layout
  // 'row' or 'col' in options) is written at the registered range's start,
  // the server computes in place, and the result is read back. Resolves to
  // { result, stats }. options: { layout, backend, timeoutMs }.
  async multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
    if (!this.client) throw new Error('dgmm: register the region first');
    if (client !== this.client) throw new Error('dgmm: the region is registered with another client');
    const job = describeJob(a, rows, cols, diag, side, options);
    const at = this.registeredOffset;
    this.write(a, at);
    const stats = await multiplyRegion(client, {
      header: job.header,
      matrix: this.ref(0),
      result: this.ref(0),
    }, options);
    return { result: this.read(new a.constructor(a.length), at), stats };
  }

  checkRange(offset, length) {
    if (this.fd === null) throw new Error('dgmm: the shared-memory region is closed');
    if (!Number.isSafeInteger(offset) || offset < 0 || offset + length > this.byteSize) {
      throw new RangeError(`dgmm: ${length} bytes at offset ${offset} do not fit the ${this.byteSize}-byte region`);
    }
  }

  closeFile() {
    if (this.fd !== null) fs.closeSync(this.fd);
    this.fd = null;
    this.unlinkAtExit();
    process.removeListener('exit', this.unlinkAtExit);
  }

  // Unregisters (errors ignored: the server drops the region of an unlinked
  // object by itself), closes and unlinks the object.
  async close(options = {}) {
    try {
      await this.unregister(options);
    } catch {
      // The server may be gone; the unlink below makes it drop the region.
    }
    this.closeFile();
  }
}

function createSharedMemoryRegion(byteSize, { key } = {}) {
  return new SharedMemoryRegion(byteSize, key);
}

module.exports = {
  createSharedMemoryRegion, SharedMemoryRegion, multiplyRegion, regionStatus, unregisterRegion,
};
