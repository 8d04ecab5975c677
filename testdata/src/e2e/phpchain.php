<?php
// PHP fixture of the end-to-end runtime test (internal/e2e/phpchains_test.go):
// the built binaries must name {main} -> top -> Chain::mid -> leaf.
//
//   php -n -d opcache.enable_cli=0 -d opcache.jit=off phpchain.php SECONDS GOFILE
//
// 1. warm: half busy in warm() (a function of its own) until GOFILE exists
//    (at most 60 s), so that the sampler has met the process and attached
//    it before the measured work; the test watches the output for a named
//    warm frame, or waits, then creates GOFILE;
// 2. sleeps 0.2 s (off CPU), prints "go NS" (wall clock, ns) and runs
//    top -> Chain::mid -> leaf for SECONDS of CPU time (getrusage: a loaded
//    machine makes the run longer, not the sample count smaller);
// 3. prints "done NS" and sleeps until killed (no samples after the work).
//
// The test counts the samples stamped from "go" to "done": each must have
// exactly leaf, Chain::mid, top, {main} as its PHP frames, leaf first, on
// the lines marked "// L:NAME". leaf asks for its CPU time once per 200,000
// additions, so that the built-in getrusage is on top of it in well under
// 1% of the samples.

function now_ns()
{
    $t = gettimeofday();
    return $t['sec'] * 1000000000 + $t['usec'] * 1000;
}

function cpu_seconds()
{
    $r = getrusage();
    return $r['ru_utime.tv_sec'] + $r['ru_utime.tv_usec'] / 1e6 + $r['ru_stime.tv_sec'] + $r['ru_stime.tv_usec'] / 1e6;
}

function warm($gofile, $limit)
{
    $s = '';
    while (microtime(true) < $limit) {
        clearstatcache();
        if (file_exists($gofile)) {
            break;
        }
        $busy = microtime(true) + 0.01;
        while (microtime(true) < $busy) {
            for ($i = 0; $i < 200; $i++) {
                $s = substr($i . $s, 0, 64);
            }
        }
        usleep(10000);
    }
    return $s;
}

function leaf($deadline)
{
    $x = 0;
    while (true) { // L:leaf
        for ($i = 0; $i < 200000; $i++) { // L:leaf
            $x += $i * $i; // L:leaf
        } // L:leaf
        if (cpu_seconds() > $deadline) { // L:leaf
            return $x; // L:leaf
        } // L:leaf
    } // L:leaf
}

class Chain
{
    public function mid($deadline)
    {
        return leaf($deadline); // L:Chain::mid
    }
}

function top($deadline)
{
    $c = new Chain();
    return $c->mid($deadline); // L:top
}

$seconds = (float)$argv[1];
$gofile = $argv[2];
warm($gofile, microtime(true) + 60);
usleep(200000);
echo "go ", now_ns(), "\n";
top(cpu_seconds() + $seconds); // L:{main}
echo "done ", now_ns(), "\n";
while (true) {
    sleep(3600);
}
