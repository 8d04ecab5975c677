// Node.js fixture of the end-to-end inlining test (internal/e2e/nodechains_test.go):
// top -> mid -> leaf are small functions that loop calls many times, so
// that TurboFan, optimizing loop while it runs (OSR), inlines all three
// into loop's code: the built binaries must name leaf <- mid <- top <- loop
// from that one code object, each with this file and a line marked
// "L:NAME".
//
//   node [V8 flags] nodeinline.js SECONDS GOFILE
//
// As nodechain.js: warm (here: loop, half busy) until GOFILE exists, print
// "go NS", run loop for SECONDS of CPU time, print "done NS", sleep until
// killed.
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

// warm runs the measured work itself, half of the time, so that TurboFan
// has compiled it (and its compiler threads are idle) before "go".
function warm(gofile, limit) {
  let s = 0;
  while (!fs.existsSync(gofile) && Date.now() < limit) {
    s = (s + loop(cpuSeconds() + 0.01)) % 1000003;
    sleep(10);
  }
  return s;
}

function leaf(n) {
  let x = 0; // L:leaf
  for (let i = 0; i < n; i++) { // L:leaf
    x = (x + i * i) % 1000003; // L:leaf
  } // L:leaf
  return x; // L:leaf
}

function mid(n) {
  return leaf(n) + 1; // L:mid
}

function top(n) {
  return mid(n) + 1; // L:top
}

function loop(deadline) {
  let s = 0;
  for (;;) { // L:loop
    for (let k = 0; k < 1000; k++) { // L:loop
      s = (s + top(400)) % 1000003; // L:loop
    } // L:loop
    if (cpuSeconds() > deadline) { // L:loop
      return s; // L:loop
    } // L:loop
  } // L:loop
}

const seconds = Number(process.argv[2]);
const gofile = process.argv[3];
warm(gofile, Date.now() + 60000);
sleep(200);
fs.writeSync(1, 'go ' + nowNs() + '\n');
loop(cpuSeconds() + seconds); // L:module
fs.writeSync(1, 'done ' + nowNs() + '\n');
setInterval(() => {}, 3600000);
