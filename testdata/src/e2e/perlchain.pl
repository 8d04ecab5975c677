# Perl fixture of the end-to-end runtime test (internal/e2e/perl_test.go):
# the built binaries must name main -> Chain::top -> Chain::mid -> Chain::leaf
# (mode chain), or main -> Chain::top -> Chain::sorter -> Chain::cmpleaf
# with sort's native frames between sorter and cmpleaf (mode sort: a
# sort { } block calls back into Perl from C), or main -> Chain::top -> 50
# Chain::deep -> Chain::leaf (mode deep).
#
#   perl perlchain.pl chain|sort|deep SECONDS GOFILE
#
# Core Perl only (perl-base of any Debian release runs it):
# 1. warm: half busy in Chain::warm until GOFILE exists (at most 60 s), so
#    that the sampler has met the process and attached before the
#    measured work; the test watches the output for a named warm frame;
# 2. sleeps 0.2 s (off CPU: no sample near the switch), prints "go" and
#    runs the chain for SECONDS of CPU time (times(): a loaded machine
#    makes the run longer, not the sample count smaller); the test stamps
#    the line when it reads it;
# 3. prints "done" and sleeps until killed (no samples after the work).
#
# Each sample between "go" and "done" must have exactly the chain's Perl
# frames, leaf first, on the lines marked "# L:NAME"; in mode sort, a
# sample in sorter's own code (its loop, the sort block's ops, sort's C
# code between two calls of cmpleaf) has the chain without cmpleaf.
use strict;
use warnings;

package Chain;

sub warm {
    my ($gofile, $limit) = @_;
    my $s = 0;
    while (!-e $gofile && time < $limit) {
        my $busy = (times)[0] + 0.01;
        while ((times)[0] < $busy) {
            $s = ($s * 7 + $_) % 1000003 for 1 .. 200;
        }
        select(undef, undef, undef, 0.01);
    }
    return $s;
}

sub leaf {
    my ($deadline) = @_;
    my $x = 0;
    while (1) {    # L:leaf
        for my $i (1 .. 20000) {    # L:leaf
            $x = ($x + $i * $i) % 1000003;    # L:leaf
        }
        return $x if (times)[0] > $deadline;    # L:leaf
    }
}

sub mid {
    return leaf($_[0]);    # L:mid
}

# cmpleaf is sort's comparison: each call busy a little.
sub cmpleaf {
    my ($x, $y) = @_;    # L:cmpleaf
    my $s = 0;    # L:cmpleaf
    for my $i (1 .. 2000) {    # L:cmpleaf
        $s = ($s + $i * $i) % 1000003;    # L:cmpleaf
    }
    return $x <=> $y;    # L:cmpleaf
}

sub sorter {
    my ($deadline) = @_;
    my @list = map { ($_ * 7919) % 1009 } 1 .. 200;
    my $n = 0;
    while ((times)[0] <= $deadline) {    # L:sorter
        my @sorted = sort { cmpleaf($a, $b) } @list;    # L:sorter
        $n += $sorted[0];    # L:sorter
    }
    return $n;
}

# deep recurses 50 subs deep, then runs leaf.
sub deep {
    my ($n, $deadline) = @_;
    return leaf($deadline) if $n == 1;    # L:deep
    return deep($n - 1, $deadline);    # L:deep
}

sub top {
    my ($mode, $deadline) = @_;
    return sorter($deadline) if $mode eq 'sort';    # L:top
    return deep(50, $deadline) if $mode eq 'deep';    # L:top
    return mid($deadline);    # L:top
}

package main;

$| = 1;
my ($mode, $seconds, $gofile) = @ARGV;
Chain::warm($gofile, time + 60);
select(undef, undef, undef, 0.2);
print "go\n";
Chain::top($mode, (times)[0] + $seconds);    # L:main
print "done\n";
sleep 3600 while 1;
