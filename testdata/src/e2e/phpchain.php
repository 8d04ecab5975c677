<?php
// PHP fixture of the end-to-end runtime test (internal/e2e/phpchains_test.go):
// the built binaries must name {main} -> top -> Chain::mid -> leaf.
//
//   php -n -d opcache.enable_cli=0 -d opcache.jit=off phpchain.php SECONDS GOFILE [MODE]
//
// MODE says what calls leaf:
//   chain     {main} -> top -> Chain::mid -> leaf (the default)
//   callback  {main} -> top -> array_map -> {closure} -> leaf: a built-in
//             that calls back into PHP (8.4 names closures {closure:FILE:LINE})
//   deep      {main} -> top -> rec x 51 -> leaf: 50 levels of recursion
//
// 1. warm: half busy in warm() (a function of its own) until GOFILE exists
//    (at most 60 s), so that the sampler has met the process and attached
//    it before the measured work; the test watches the output for a named
//    warm frame, or waits, then creates GOFILE;
// 2. measures how many additions leaf does per CPU second (getrusage), sleeps
//    0.2 s (off CPU), prints "go NS" (wall clock, ns) and runs
//    top -> Chain::mid -> leaf for that many times SECONDS (a loaded machine
//    makes the run longer, not the sample count smaller), calling no
//    built-in meanwhile;
// 3. prints "done NS" and sleeps until killed (no samples after the work).
//
// The test counts the samples stamped from "go" to "done": each must have
// exactly leaf, Chain::mid, top, {main} as its PHP frames, leaf first, on
// the lines marked "// L:NAME".

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

function leaf($n)
{
    $x = 0;
    for ($i = 0; $i < $n; $i++) { // L:leaf
        $x = ($x + $i * $i) & 0xfffffff; // L:leaf (stays an int)
    } // L:leaf
    return $x; // L:leaf
}

// rate is how many of leaf's additions this engine does per CPU second,
// measured over 0.3 s.
function rate()
{
    $n = 0;
    $start = cpu_seconds();
    while (($t = cpu_seconds() - $start) < 0.3) {
        leaf(100000);
        $n += 100000;
    }
    return $n / $t;
}

class Chain
{
    public function mid($n)
    {
        return leaf($n); // L:Chain::mid
    }
}

function rec($depth, $n)
{
    if ($depth == 0) { // L:rec
        return leaf($n); // L:rec
    } // L:rec
    return rec($depth - 1, $n); // L:rec
}

function top($n, $mode)
{
    if ($mode == 'callback') { // L:top
        return array_map(function ($n) { // L:top
            return leaf($n); // L:{closure}
        }, [$n])[0]; // L:top
    } // L:top
    if ($mode == 'deep') { // L:top
        return rec(50, $n); // L:top
    } // L:top
    $c = new Chain(); // L:top
    return $c->mid($n); // L:top
}

$seconds = (float)$argv[1];
$gofile = $argv[2];
$mode = $argv[3] ?? 'chain';
warm($gofile, microtime(true) + 60);
$n = (int)(rate() * $seconds);
now_ns();
usleep(200000);
echo "go ", now_ns(), "\n";
top($n, $mode); // L:{main}
echo "done ", now_ns(), "\n";
while (true) {
    sleep(3600);
}
