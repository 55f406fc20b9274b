'use strict';
// The one seeded generator of the Node tests and the Node conformance runner:
// uniform values in [-4, 4) from mulberry32, so that failures reproduce.

function random(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 8 - 4;
  };
}

module.exports = { random };
