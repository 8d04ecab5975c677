<?php
// The other script of the PHP-FPM end-to-end test
// (internal/e2e/phpfpm_test.go): the warm-up requests, and one request
// after each measured one, so that the next request's {main} op_array
// takes the memory fpmchain.php's had: a {main} frame named after its
// request ended must not take this file's name (issue 28).

function warm($n)
{
    $s = '';
    for ($i = 0; $i < $n; $i++) {
        $s = substr($i . $s, 0, 64);
    }
    return $s;
}

$n = isset($_GET['n']) ? (int)$_GET['n'] : 2000;
echo "ok " . warm($n) . "\n";
