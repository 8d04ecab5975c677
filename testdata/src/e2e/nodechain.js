// Node.js fixture of the end-to-end runtime test (internal/e2e/nodechains_test.go):
// the built binaries must name top -> mid -> leaf, each with this file and
// a line marked "L:NAME".
//
//   node [V8 flags] nodechain.js SECONDS GOFILE
//
// 1. warm: half busy in warm() until GOFILE exists (at most 60 s), so that
//    the sampler has met the process and attached V8 before the measured
//    work; the test watches the output for a named warm frame, or waits,
//    then creates GOFILE;
// 2. sleeps 0.2 s (off CPU), prints "go NS" and runs top -> mid -> leaf for
//    SECONDS of CPU time (process.cpuUsage);
// 3. prints "done NS" and sleeps until killed.
'use strict';
const fs = require('fs');

function nowNs() {
  return (BigInt(Date.now()) * 1000000n).toString();
}

function cpuSeconds() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

function sleep(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function warm(gofile, limit) {
  // What runs between "go" and top, called once here: under
  // --always-turbofan (Node 18: --always-opt) a function is compiled, on
  // the main thread, at its first call, and those compilations were
  // sampled as the measured work (3 of 348 samples outside the chain).
  cpuSeconds();
  nowNs();
  fs.writeSync(1, '');
  let s = 0;
  while (!fs.existsSync(gofile) && Date.now() < limit) {
    const busy = Date.now() + 10;
    while (Date.now() < busy) {
      for (let i = 0; i < 2000; i++) s = (s + i * i) % 1000003;
    }
    sleep(10);
  }
  return s;
}

function leaf(deadline) {
  let x = 0;
  for (;;) { // L:leaf
    for (let i = 0; i < 20000; i++) { // L:leaf
      x = (x + i * i) % 1000003; // L:leaf
    } // L:leaf
    if (cpuSeconds() > deadline) { // L:leaf
      return x; // L:leaf
    } // L:leaf
  } // L:leaf
}

function mid(deadline) {
  return leaf(deadline); // L:mid
}

function top(deadline) {
  return mid(deadline); // L:top
}

const seconds = Number(process.argv[2]);
const gofile = process.argv[3];
warm(gofile, Date.now() + 60000);
sleep(200);
// fs.writeSync: process.stdout's first write loads and compiles node's
// stream modules, which would be sampled as the measured work's.
fs.writeSync(1, 'go ' + nowNs() + '\n');
top(cpuSeconds() + seconds);
fs.writeSync(1, 'done ' + nowNs() + '\n');
setInterval(() => {}, 3600000);
