# frozen_string_literal: true

# Ruby fixture of the agreement test with stackprof
# (internal/e2e/agree_test.go): ten methods w1 ... w10 whose own work
# is in the ratio 1:2:...:10, called in turn for SECONDS of CPU time under
# StackProf (cpu mode, a sample per ms of CPU) while profsym samples the
# same process.
#
#   ruby rubyweights.rb SECONDS GOFILE
#
# As rubychain.rb: warm (half busy) until GOFILE exists, sleep 0.2 s, print
# "go NS", run, print "done NS"; then one line "stackprof JSON" with
# stackprof's sample count and each method's own samples, and sleep until
# killed.

require 'json'
require 'stackprof'

UNIT = 2000

def now_ns
  Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
end

def cpu_seconds
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
end

def warm(gofile, limit)
  s = 0
  while !File.exist?(gofile) && Time.now < limit
    busy = cpu_seconds + 0.01
    s += w1 while cpu_seconds < busy
    sleep 0.01
  end
  s
end

def w1
  x = 0
  i = 0
  while i < 1 * UNIT # L:w1
    x += i # L:w1
    i += 1 # L:w1
  end
  x
end

def w2
  x = 0
  i = 0
  while i < 2 * UNIT # L:w2
    x += i # L:w2
    i += 1 # L:w2
  end
  x
end

def w3
  x = 0
  i = 0
  while i < 3 * UNIT # L:w3
    x += i # L:w3
    i += 1 # L:w3
  end
  x
end

def w4
  x = 0
  i = 0
  while i < 4 * UNIT # L:w4
    x += i # L:w4
    i += 1 # L:w4
  end
  x
end

def w5
  x = 0
  i = 0
  while i < 5 * UNIT # L:w5
    x += i # L:w5
    i += 1 # L:w5
  end
  x
end

def w6
  x = 0
  i = 0
  while i < 6 * UNIT # L:w6
    x += i # L:w6
    i += 1 # L:w6
  end
  x
end

def w7
  x = 0
  i = 0
  while i < 7 * UNIT # L:w7
    x += i # L:w7
    i += 1 # L:w7
  end
  x
end

def w8
  x = 0
  i = 0
  while i < 8 * UNIT # L:w8
    x += i # L:w8
    i += 1 # L:w8
  end
  x
end

def w9
  x = 0
  i = 0
  while i < 9 * UNIT # L:w9
    x += i # L:w9
    i += 1 # L:w9
  end
  x
end

def w10
  x = 0
  i = 0
  while i < 10 * UNIT # L:w10
    x += i # L:w10
    i += 1 # L:w10
  end
  x
end

def run_all(deadline)
  s = 0
  while cpu_seconds < deadline
    s += w1 + w2 + w3 + w4 + w5 + w6 + w7 + w8 + w9 + w10
  end
  s
end

seconds = Float(ARGV[0])
warm(ARGV[1], Time.now + 60)
sleep 0.2
$stdout.write("go #{now_ns}\n")
$stdout.flush
data = StackProf.run(mode: :cpu, interval: 1000) { run_all(cpu_seconds + seconds) }
$stdout.write("done #{now_ns}\n")
own = {}
data[:frames].each_value { |f| own[f[:name]] = own.fetch(f[:name], 0) + f[:samples] }
$stdout.write("stackprof #{JSON.generate(total: data[:samples], self: own)}\n")
$stdout.flush
sleep
