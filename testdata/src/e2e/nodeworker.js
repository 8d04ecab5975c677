// Node.js fixture of the worker-thread test (internal/e2e/nodechains_test.go
// TestRecordNodeWorker): nodechain.js, with its arguments, in a worker
// thread, between two idle workers, while the main thread waits in the
// event loop. Each worker runs an isolate of its own, with a code range
// and a copy of V8's builtins of its own: the working one's lies between
// the others'.
//
//   node [V8 flags] nodeworker.js SECONDS GOFILE
'use strict';
const path = require('path');
const { Worker } = require('worker_threads');

const idle = () => new Worker('setInterval(() => {}, 1 << 30);', { eval: true });
idle();
new Worker(path.join(__dirname, 'nodechain.js'), { argv: process.argv.slice(2) });
idle();
