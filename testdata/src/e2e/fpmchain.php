<?php
// PHP-FPM fixture of the end-to-end runtime test
// (internal/e2e/phpfpm_test.go): each request runs
// {main} -> top -> Chain::mid -> leaf for ?rounds=N rounds of 20,000
// additions (default 400), calling no built-in meanwhile, then answers
// "ok".
// The test counts the workers' samples while requests run: each must have
// exactly leaf, Chain::mid, top, {main} as its PHP frames, leaf first, on
// the lines marked "// L:NAME", or be in a request of fpmwarm.php, the
// other script the workers serve in between.

function leaf($n)
{
    $x = 0;
    for ($i = 0; $i < $n; $i++) { // L:leaf
        $x = ($x + $i * $i) & 0xfffffff; // L:leaf (stays an int)
    } // L:leaf
    return $x; // L:leaf
}

class Chain
{
    public static function mid($rounds, $n)
    {
        $s = 0;
        for ($r = 0; $r < $rounds; $r++) { // L:Chain::mid
            $s ^= leaf($n); // L:Chain::mid
        } // L:Chain::mid
        return $s; // L:Chain::mid
    }
}

function top($rounds, $n)
{
    return Chain::mid($rounds, $n); // L:top
}

// A round takes about 0.13 ms on these machines with opcache on; no clock
// is read in the measured chain.
$rounds = isset($_GET['rounds']) ? (int)$_GET['rounds'] : 400;
$s = top(max(1, $rounds), 20000); // L:{main}
echo "ok $s\n";
