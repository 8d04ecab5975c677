package offcpu

import "strings"

// Reasons a thread waited, the value of the sample attribute
// profsym.off_cpu.reason (docs/frame-format.md).
const (
	ReasonPreempted  = "preempted"   // still runnable: preempted, or it yielded; it waited for a CPU
	ReasonPageFault  = "page_fault"  // a page fault waited (for the disk, a lock)
	ReasonFutex      = "futex"       // a user-space lock or condition (futex_wait)
	ReasonPipe       = "pipe"        // reading or writing a pipe or FIFO
	ReasonSocket     = "socket"      // a socket: receive, send, accept, connect
	ReasonTTY        = "tty"         // a terminal
	ReasonPoll       = "poll"        // epoll, poll, select
	ReasonSleep      = "sleep"       // nanosleep, clock_nanosleep
	ReasonIO         = "io"          // block I/O and its waits: fsync, a page being read or written
	ReasonKernelLock = "kernel_lock" // a kernel mutex or rwsem
	ReasonChild      = "child"       // waitpid and friends
	ReasonSignal     = "signal"      // pause, sigsuspend, sigtimedwait
	ReasonOther      = "other"       // none of the above
	ReasonUnknown    = "unknown"     // no kernel stack to tell
)

// rules map kernel functions to reasons, in order of precedence: a stack
// takes the first reason any of its frames has (a page fault that waits
// for the disk is a page fault; an epoll_wait with a timeout is a poll).
// A pattern ending in '*' is a prefix.
var rules = []struct {
	reason   string
	patterns []string
}{
	{ReasonPageFault, []string{"exc_page_fault", "asm_exc_page_fault", "do_user_addr_fault", "do_page_fault", "__do_page_fault", "handle_mm_fault"}},
	{ReasonFutex, []string{"futex_*", "__futex_*", "do_futex"}},
	{ReasonPipe, []string{"pipe_*", "anon_pipe_*", "wait_for_partner", "fifo_open"}},
	{ReasonSocket, []string{"sock_*", "sk_*", "__sk_*", "tcp_*", "udp_*", "unix_*", "inet_*", "inet6_*", "__skb_*", "skb_recv_*",
		"__sys_recv*", "__sys_send*", "__sys_accept*", "__sys_connect*", "___sys_recvmsg", "___sys_sendmsg", "netlink_*"}},
	{ReasonTTY, []string{"n_tty_*", "tty_*"}},
	{ReasonPoll, []string{"ep_poll", "do_epoll_*", "do_sys_poll", "do_select", "core_sys_select", "do_pselect*"}},
	{ReasonSleep, []string{"do_nanosleep", "hrtimer_nanosleep", "common_nsleep*", "clock_nanosleep", "__x64_sys_nanosleep", "__arm64_sys_nanosleep"}},
	{ReasonIO, []string{"io_schedule*", "bit_wait_io*", "folio_wait_*", "__folio_lock*", "wait_on_page_*", "__lock_page*",
		"blkdev_issue_flush", "submit_bio_wait", "jbd2_*", "file_write_and_wait*", "filemap_fdatawait*", "__filemap_fdatawait*",
		"filemap_write_and_wait*", "xfs_log_force*", "wait_on_buffer", "__wait_on_buffer", "blk_mq_get_tag"}},
	{ReasonKernelLock, []string{"mutex_lock*", "__mutex_lock*", "rwsem_down_*", "down_read*", "down_write*", "__down*", "down",
		"percpu_down_*", "rt_mutex_*", "__rt_mutex_*"}},
	{ReasonChild, []string{"do_wait", "kernel_wait4", "kernel_waitid", "__do_sys_wait4"}},
	{ReasonSignal, []string{"sigsuspend", "do_sigtimedwait", "__do_sys_pause", "sys_pause", "__x64_sys_pause", "__x64_sys_rt_sigsuspend"}},
}

// Reason tells why a thread waited from its kernel frames (function names,
// leaf first; suffixes such as ".isra.0" are ignored) and whether it was
// still runnable when it left the CPU.
func Reason(frames []string, runnable bool) string {
	if runnable {
		return ReasonPreempted
	}
	if len(frames) == 0 {
		return ReasonUnknown
	}
	best := len(rules)
	for _, f := range frames {
		if i := strings.IndexByte(f, '.'); i > 0 {
			f = f[:i]
		}
		for r := 0; r < best; r++ {
			if matchAny(f, rules[r].patterns) {
				best = r
				break
			}
		}
		if best == 0 {
			break
		}
	}
	if best == len(rules) {
		return ReasonOther
	}
	return rules[best].reason
}

func matchAny(name string, patterns []string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}
