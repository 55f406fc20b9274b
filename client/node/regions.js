'use strict';
// Regions (docs/protocol.md section 10) from Node, through the C++ core
// (dgmm/regions.h): a region is a sealed memfd this process maps and passes
// to the server's local socket by descriptor, so the server maps only memory
// its client opened itself. `region.buffer` is an ArrayBuffer over the
// mapping: typed arrays made on it are read and written by the server in
// place, and multiply() runs a job whose matrix and out lie in a region of
// this client there, with no copy.

const dgmm = require('./dgmm');

const { native, call, errorOf, describeJob } = dgmm;

class SharedMemoryRegion {
  constructor(client, handle) {
    this.client = client;
    this.name = handle.name;
    this.size = handle.size;
    this.registration = handle.registration;
    // The mapped bytes (no copy): view them with typed arrays.
    this.buffer = handle.buffer;
    this._native = handle.native;
    this._registered = true;
  }

  // [name, offset]: a place in this region, for multiplyRegion.
  ref(offset = 0) {
    if (!Number.isInteger(offset) || offset < 0 || offset > this.size) {
      throw new RangeError(`dgmm: offset ${offset} is outside region ${this.name} (${this.size} bytes)`);
    }
    return [this.name, offset];
  }

  // A typed array of `Ctor` over `length` elements at byte `offset` of the region.
  view(Ctor, offset = 0, length = Math.floor((this.size - offset) / Ctor.BYTES_PER_ELEMENT)) {
    return new Ctor(this.buffer, offset, length);
  }

  // Copies `typed` into the region at byte `offset`.
  write(typed, offset = 0) {
    new Uint8Array(this.buffer, offset, typed.byteLength).set(new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength));
  }

  // Copies the region's bytes at `offset` into `typed`; returns it.
  read(typed, offset = 0) {
    new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength).set(new Uint8Array(this.buffer, offset, typed.byteLength));
    return typed;
  }

  // Unregisters the region (the server drops it; the mapping stays while
  // this object or a view of it lives).
  async unregister() {
    if (!this._registered) return;
    this._registered = false;
    await call(native.unregisterOwnRegion, this._native);
  }

  // As unregister(), ignoring its error (a region unregistered by name, or
  // one its session's end took): the C++ destructor's rule.
  async close() {
    try {
      await this.unregister();
    } catch {
      // Nothing left to do.
    }
  }
}

// Creates a region of `bytes` bytes and registers it as `name` (default:
// the memfd's name). FAILED_PRECONDITION when the server is not on this host
// or does not take regions.
async function createSharedMemoryRegion(client, bytes, name = '') {
  if (!Number.isInteger(bytes) || bytes <= 0) throw new RangeError('dgmm: a region needs a positive whole number of bytes');
  const handle = await call(native.createRegion, client._core(''), bytes, name);
  return new SharedMemoryRegion(client, handle);
}

// One job on regions: { rows, cols, dtype, layout, side, backend, matrix:
// ref, result: ref, diagonal (typed array), right (side 'both'),
// diagonalDtype, resultDtype, timeoutMs }. Resolves to the job's stats.
// Retried only after a full admission queue (the pushback): the job may be
// in place.
function multiplyRegion(client, spec) {
  let job;
  try {
    const dtype = spec.dtype || 'float32';
    const { parts, Ctor } = dgmm.DTYPES[dtype] || {};
    if (!Ctor) throw new RangeError(`dgmm: unknown dtype "${dtype}"`);
    // The same conversions as multiply(), over a stand-in for A.
    const a = { length: spec.rows * spec.cols * parts };
    Object.setPrototypeOf(a, Ctor.prototype);
    const side = spec.side || 'right';
    job = describeJob(a, spec.rows, spec.cols, side === 'both' ? [spec.diagonal, spec.right] : spec.diagonal, side, spec);
  } catch (e) {
    return Promise.reject(errorOf(e));
  }
  const [, dtypeWire, rows, cols, layout, sideWire, backend, d, dDtype, right, cDtype] = job.args;
  return call(native.multiplyRegion, client._core(''), {
    rows, cols, dtype: dtypeWire, layout, side: sideWire, backend, diagonal: d, right, diagonalDtype: dDtype,
    resultDtype: cDtype, matrix: spec.matrix, result: spec.result, timeoutMs: spec.timeoutMs,
  });
}

// This client's regions (one with `name`), the bytes of all, the budget.
async function regionStatus(client, name = '') {
  return call(native.regionStatus, client._core(''), name);
}

// Unregisters region `name`, or all of this owner's with ''; resolves to how many.
async function unregisterRegion(client, name = '') {
  return call(native.unregisterRegion, client._core(''), name);
}

// The client's session on the server's local socket: its hello (uid, gid,
// pid, processMemory, ...).
async function regionSession(client) {
  return call(native.regionSession, client._core(''));
}

module.exports = {
  SharedMemoryRegion, createSharedMemoryRegion, multiplyRegion, regionStatus, unregisterRegion, regionSession,
};
