<?php
// PHP fixture of the agreement test with excimer (internal/e2e/agree_test.go):
// ten functions w1 ... w10 whose own work is in the ratio 1:2:...:10,
// called in turn for SECONDS of CPU time under ExcimerProfiler (CPU time,
// a sample per ms) while profsym samples the same process.
//
//   php -n -d extension=excimer phpweights.php SECONDS GOFILE
//
// As phpchain.php: warm (half busy) until GOFILE exists, sleep 0.2 s,
// print "go NS", run, print "done NS"; then one line "excimer JSON" with
// excimer's sample count and each function's own samples, and sleep until
// killed.

const UNIT = 2000;

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
    $s = 0;
    while (microtime(true) < $limit) {
        clearstatcache();
        if (file_exists($gofile)) {
            break;
        }
        $busy = cpu_seconds() + 0.01;
        while (cpu_seconds() < $busy) {
            $s += w1();
        }
        usleep(10000);
    }
    return $s;
}

function w1()
{
    $x = 0;
    for ($i = 0; $i < 1 * UNIT; $i++) { // L:w1
        $x = ($x + $i) % 1000003; // L:w1
    }
    return $x;
}

function w2()
{
    $x = 0;
    for ($i = 0; $i < 2 * UNIT; $i++) { // L:w2
        $x = ($x + $i) % 1000003; // L:w2
    }
    return $x;
}

function w3()
{
    $x = 0;
    for ($i = 0; $i < 3 * UNIT; $i++) { // L:w3
        $x = ($x + $i) % 1000003; // L:w3
    }
    return $x;
}

function w4()
{
    $x = 0;
    for ($i = 0; $i < 4 * UNIT; $i++) { // L:w4
        $x = ($x + $i) % 1000003; // L:w4
    }
    return $x;
}

function w5()
{
    $x = 0;
    for ($i = 0; $i < 5 * UNIT; $i++) { // L:w5
        $x = ($x + $i) % 1000003; // L:w5
    }
    return $x;
}

function w6()
{
    $x = 0;
    for ($i = 0; $i < 6 * UNIT; $i++) { // L:w6
        $x = ($x + $i) % 1000003; // L:w6
    }
    return $x;
}

function w7()
{
    $x = 0;
    for ($i = 0; $i < 7 * UNIT; $i++) { // L:w7
        $x = ($x + $i) % 1000003; // L:w7
    }
    return $x;
}

function w8()
{
    $x = 0;
    for ($i = 0; $i < 8 * UNIT; $i++) { // L:w8
        $x = ($x + $i) % 1000003; // L:w8
    }
    return $x;
}

function w9()
{
    $x = 0;
    for ($i = 0; $i < 9 * UNIT; $i++) { // L:w9
        $x = ($x + $i) % 1000003; // L:w9
    }
    return $x;
}

function w10()
{
    $x = 0;
    for ($i = 0; $i < 10 * UNIT; $i++) { // L:w10
        $x = ($x + $i) % 1000003; // L:w10
    }
    return $x;
}

function run_all($deadline)
{
    $s = 0;
    while (cpu_seconds() < $deadline) {
        $s += w1() + w2() + w3() + w4() + w5() + w6() + w7() + w8() + w9() + w10();
    }
    return $s;
}

$seconds = (float)$argv[1];
warm($argv[2], microtime(true) + 60);
usleep(200000);
fwrite(STDOUT, "go " . now_ns() . "\n");
$prof = new ExcimerProfiler();
$prof->setEventType(EXCIMER_CPU);
$prof->setPeriod(0.001);
$prof->start();
run_all(cpu_seconds() + $seconds);
$prof->stop();
fwrite(STDOUT, "done " . now_ns() . "\n");
$log = $prof->getLog();
$total = 0;
foreach ($log as $entry) {
    $total += $entry->getEventCount();
}
$self = [];
foreach ($log->aggregateByFunction() as $name => $info) {
    $self[$name] = $info['self'];
}
fwrite(STDOUT, "excimer " . json_encode(['total' => $total, 'self' => $self]) . "\n");
while (true) {
    sleep(3600);
}
