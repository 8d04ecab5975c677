# frozen_string_literal: true

# Ruby fixture of the end-to-end runtime test (internal/e2e/rubychains_test.go):
# the built binaries must name the chain below, leaf first, with files and lines.
#
#   ruby --disable-gems rubychain.rb SECONDS GOFILE [MODE]
#
# MODE says what runs leaf:
#   chain   <main> -> Object#top -> Chain#mid -> Chain#run_block ->
#           block in Chain#mid -> Chain#leaf (the default): a method, and a
#           block a Ruby method yields to
#   deep    <main> -> Object#top -> Chain#rec x 51 -> Chain#leaf: 50 levels
#           of recursion
#   each    <main> -> Object#top -> Chain#each_mid -> Array#each (a C
#           function) -> block in Chain#each_mid -> Chain#leaf
#   thread  the chain in a Thread.new (its first frame "block in <main>"),
#           the main thread waiting in Thread#join
#
# 1. warm: half busy in warm (a method of its own) until GOFILE exists (at
#    most 60 s), so that the sampler has met the process and attached it
#    before the measured work;
# 2. measures how many of leaf's additions it does per CPU second, sleeps
#    0.2 s (off CPU), prints "go NS" (wall clock, ns) and runs the chain for
#    that many times SECONDS (a loaded machine makes the run longer, not the
#    sample count smaller);
# 3. prints "done NS" and sleeps until killed (no samples after the work).
#
# The test counts the samples stamped from "go" to "done": each must have
# exactly the mode's chain as its Ruby frames on the lines marked "# L:NAME".

def now_ns
  Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
end

def cpu_seconds
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
end

def warm(gofile, limit)
  s = +""
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < limit
    break if File.exist?(gofile)
    busy = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.01
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < busy
      200.times { |i| s = (i.to_s + s)[0, 64] }
    end
    sleep 0.01
  end
  s
end

class Chain
  def leaf(n)
    x = 0 # L:Chain#leaf
    i = 0 # L:Chain#leaf
    while i < n # L:Chain#leaf
      x = (x + i * i) & 0xfffffff # L:Chain#leaf
      i += 1 # L:Chain#leaf
    end # L:Chain#leaf
    x # L:Chain#leaf
  end

  def run_block
    yield # L:Chain#run_block
  end

  def mid(n)
    run_block { leaf(n) } # L:Chain#mid L:block in Chain#mid
  end

  ONE = [0].freeze

  def each_mid(n)
    ONE.each { leaf(n) } # L:Chain#each_mid L:block in Chain#each_mid
  end

  def rec(depth, n)
    return leaf(n) if depth.zero? # L:Chain#rec
    rec(depth - 1, n) # L:Chain#rec
  end
end

# top allocates nothing and calls no C function: the measured samples
# are the chain's.
def top(c, n, kind)
  return c.rec(50, n) if kind == 1 # L:Object#top
  return c.each_mid(n) if kind == 2 # L:Object#top
  c.mid(n) # L:Object#top
end

# rate is how many of leaf's additions this Ruby does per CPU second,
# measured over 0.3 s.
def rate(c)
  n = 0
  start = cpu_seconds
  n += c.leaf(100_000) * 0 + 100_000 while cpu_seconds - start < 0.3
  n / (cpu_seconds - start)
end

secs = Float(ARGV[0])
gofile = ARGV[1]
mode = ARGV[2] || "chain"
kind = { "deep" => 1, "each" => 2 }.fetch(mode, 0)
warm(gofile, Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60)
c = Chain.new
total = (rate(c) * secs).to_i
sleep 0.2
$stdout.puts "go #{now_ns}"
$stdout.flush
work = lambda do
  done = 0
  while done < total # L:<main> L:block in <main>
    top(c, 3_000_000, kind) # L:<main> L:block in <main>
    done += 3_000_000 # L:<main> L:block in <main>
  end
end
if mode == "thread"
  Thread.new(&work).join
else
  done = 0
  while done < total # L:<main>
    top(c, 3_000_000, kind) # L:<main>
    done += 3_000_000 # L:<main>
  end
end
$stdout.puts "done #{now_ns}"
$stdout.flush
sleep
