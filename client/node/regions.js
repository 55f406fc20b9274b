'use strict';
// Shared-memory regions for the Node.js client (docs/protocol.md "Regions"),
// without a native addon: Node cannot map memory, but a POSIX shared-memory
// object on Linux is a file in /dev/shm (glibc's shm_open(key) opens
// /dev/shm/<key>), so this module creates that file (mode 0600), writes the
// matrix into it with one pwrite, has the server compute in it, and reads the
// result back with one pread. The object's pages are the very memory the
// server maps (and pins on a GPU server): no matrix byte crosses the socket
// and nothing is serialized, but the client makes two kernel copies per job
// (in and out) that a mapping would avoid.
//
// The server maps only memory its client could open itself. A
// client gets a session on the server's local socket (local_socket.js), and
// there passes its memory's descriptor (SCM_RIGHTS) for a ticket. Node.js
// cannot send a descriptor without a native addon, so this module asks the
// server to open the object by key instead (open_shm), which the server does
// only for an object owned by this process's uid and writable by it alone,
// and registers the ticket it gets. Every region call carries the session
// (metadata `dgmm-session`); the session is opened on the client's first
// region call (GetServerInfo names the socket and the server's instance id,
// which the socket's hello must repeat) and closed by client.close(). When
// the session's connection closes (client.close(), this process exits, the
// server restarts), the server unregisters the regions registered through
// it. Memfds, CUDA IPC and CUDA VMM need a native addon and are not offered.
//
//   const dgmm = require('./dgmm');
//   const regions = require('./regions');
//   const client = dgmm.createClient('127.0.0.1:50051');
//   const shm = regions.createSharedMemoryRegion(rows * cols * 8);
//   await shm.register(client, 'work');
//   const { result, stats } = await shm.multiply(client, a, rows, cols, d, 'right');
//   await shm.close();   // unregisters, closes and unlinks the object
//   client.close();      // ends the session
//
// The server must run with --allow_regions on this host, and this process
// must see the server's /dev/shm (same host and IPC namespace, or /dev/shm
// shared) and its local socket (createClient's localSocket option names the
// path when this process sees it elsewhere). Region calls are not retried (a
// job in place must not run twice).

const crypto = require('node:crypto');
const fs = require('node:fs');
const { DgmmError, describeJob, serverInfo, grpc, LOCAL_SOCKET } = require('./dgmm');
const { LocalSession } = require('./local_socket');

const SHM_DIR = '/dev/shm';
const KEY = /^\/[A-Za-z0-9._-]{1,200}$/;
const NAME = /^[A-Za-z0-9._-]{1,64}$/;
// The client's region session: { promise, session, clientClosed }.
const SESSION = Symbol('dgmm.regionSession');

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

// The client's LocalSession, opened on first use and kept until
// client.close() (or until its connection breaks: the next call opens a new
// one). Rejects with FAILED_PRECONDITION when the server has regions off or
// its socket belongs to another server, UNAVAILABLE when the socket cannot
// be reached.
function regionSession(client, { timeoutMs } = {}) {
  let state = client[SESSION];
  if (!state) {
    state = { promise: null, session: null, clientClosed: false };
    client[SESSION] = state;
    const closeBefore = client.close;
    client.close = function close(...args) {
      state.clientClosed = true;
      if (state.session) state.session.close();
      state.session = null;
      return closeBefore.apply(this, args);
    };
  }
  if (state.clientClosed) return Promise.reject(new DgmmError(grpc.status.CANCELLED, 'dgmm: the client is closed'));
  if (!state.promise) {
    const opening = openSession(client, timeoutMs).then((session) => {
      if (state.clientClosed) {
        session.close();
        throw new DgmmError(grpc.status.CANCELLED, 'dgmm: the client is closed');
      }
      state.session = session;
      session.closed.then(() => {
        if (state.session === session) {
          state.session = null;
          state.promise = null;
        }
      });
      return session;
    });
    opening.catch(() => {
      if (state.promise === opening) state.promise = null; // The next call tries again.
    });
    state.promise = opening;
  }
  return state.promise;
}

async function openSession(client, timeoutMs) {
  const info = await serverInfo(client, { timeoutMs });
  if (!info.limits || !info.limits.regionsEnabled) {
    throw new DgmmError(grpc.status.FAILED_PRECONDITION, 'dgmm: regions are off on this server (it runs without --allow_regions)');
  }
  const socketPath = client[LOCAL_SOCKET] || info.limits.localSocket;
  if (!socketPath) {
    throw new DgmmError(grpc.status.FAILED_PRECONDITION, 'dgmm: the server reports no local socket, so no region session');
  }
  return LocalSession.open(socketPath, { expectedInstanceId: info.instanceId, timeoutMs });
}

// One unary region RPC on the dgmm client's channel with the session's
// `dgmm-session` metadata; rejects with DgmmError.
function callIn(client, session, method, request, options = {}) {
  const deadline = options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
  const metadata = new grpc.Metadata();
  metadata.set('dgmm-session', session.session);
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline },
      (err, response) => (err ? reject(DgmmError.fromServiceError(err)) : resolve(response)));
  });
}

async function call(client, method, request, options = {}) {
  return callIn(client, await regionSession(client, options), method, request, options);
}

// RegionStatus of the regions of this process's uid (or the one named), and
// the bytes all clients registered against the budget: GetRegionStatusResponse.
function regionStatus(client, name = '', options = {}) {
  return call(client, 'GetRegionStatus', { name }, options);
}

// Unregisters one region by name, or every region of this uid (''; other
// processes' of the same uid too). Resolves to how many were unregistered.
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

// A POSIX shared-memory object this process creates (exclusively, mode 0600:
// owner read/write only, as the server's open_shm requires) and sizes. key:
// "/" + 1-200 of [A-Za-z0-9._-]; default a fresh "/dgmm-node-<pid>-<random>".
// It is unlinked by close() and, failing that, when the process exits
// normally.
class SharedMemoryRegion {
  constructor(byteSize, key) {
    if (!Number.isSafeInteger(byteSize) || byteSize <= 0) throw new RangeError('dgmm: byteSize must be a positive integer');
    this.key = checkKey(key ?? `/dgmm-node-${process.pid}-${crypto.randomBytes(6).toString('hex')}`);
    this.path = SHM_DIR + this.key;
    this.byteSize = byteSize;
    this.fd = fs.openSync(this.path, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600);
    this.client = null;
    this.name = null;
    this.session = null;
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
  // with `client` under `name`: the client's session asks the server to open
  // the object (open_shm) for a ticket, and RegisterRegion names the ticket.
  // Resolves to the server's RegionStatus. The region lives until
  // unregister()/close(), or until the client's session ends.
  async register(client, name, { offset = 0, byteSize = this.byteSize - offset, timeoutMs } = {}) {
    checkName(name);
    if (this.client) throw new Error(`dgmm: region is already registered as ${this.name}`);
    // Checked here: a request the server refuses after open_shm leaves an
    // unclaimed ticket behind until it expires.
    if (!Number.isSafeInteger(byteSize) || byteSize <= 0) throw new RangeError('dgmm: byteSize must be a positive integer');
    this.checkRange(offset, byteSize);
    const session = await regionSession(client, { timeoutMs });
    const { ticket } = await session.openShm(this.key, { timeoutMs });
    const response = await callIn(client, session, 'RegisterRegion',
      { name, localFd: { ticket, offset, byteSize } }, { timeoutMs });
    Object.assign(this, { client, name, session, status: response.region, registeredOffset: offset });
    return response.region;
  }

  // Whether the region is registered and its session still open (a closed
  // session took the region with it).
  get registered() {
    return this.client !== null && !this.session.isClosed;
  }

  // Unregisters the region; resolves to whether the server had it. Nothing
  // is sent once its session has closed: the server dropped it then, and the
  // name may since belong to another region of this uid.
  async unregister(options = {}) {
    if (!this.client) return false;
    const { client, name, session } = this;
    this.client = this.name = this.session = null;
    if (session.isClosed) return false;
    try {
      return (await callIn(client, session, 'UnregisterRegion', { name }, options)).unregistered > 0;
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
  // the server computes in place (C of a wider dtype than A's: after A, so
  // the region must hold both), and the result, typed as its dtype, is read
  // back. Resolves to { result, stats }. options: { layout, backend,
  // timeoutMs, dtype, diagonalDtype, resultDtype } as for dgmm.multiply.
  async multiply(client, a, rows, cols, diag, side = 'right', options = {}) {
    if (!this.client) throw new Error('dgmm: register the region first');
    if (client !== this.client) throw new Error('dgmm: the region is registered with another client');
    if (this.session.isClosed) {
      throw new DgmmError(grpc.status.FAILED_PRECONDITION,
        `dgmm: the session region ${this.name} was registered through has closed, and the server dropped the region: register it again`);
    }
    const job = describeJob(a, rows, cols, diag, side, options);
    const at = this.registeredOffset;
    this.write(a, at);
    // C over A, or after it when C's dtype is wider than A's.
    const resultAt = job.outBytes === a.byteLength ? 0 : Math.ceil(a.byteLength / 256) * 256;
    const request = { header: job.header, matrix: this.ref(0), result: this.ref(resultAt) };
    const { stats } = await callIn(client, this.session, 'MultiplyRegion', request, options);
    return { result: this.read(new job.OutCtor(job.outLength), at + resultAt), stats };
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

  // Unregisters (errors ignored), closes and unlinks the object. The server
  // keeps an unlinked object mapped while it is registered: a region that
  // could not be unregistered here goes when the client's session ends.
  async close(options = {}) {
    try {
      await this.unregister(options);
    } catch {
      // The server may be gone, and with it the region.
    }
    this.closeFile();
  }
}

function createSharedMemoryRegion(byteSize, { key } = {}) {
  return new SharedMemoryRegion(byteSize, key);
}

module.exports = {
  createSharedMemoryRegion, SharedMemoryRegion, multiplyRegion, regionStatus, unregisterRegion,
  regionSession, LocalSession,
};
