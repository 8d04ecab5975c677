package offcpu

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Kernel stacks as Linux 6.18 records them at sched_switch, leaf first
// (the tracepoint's own frames left out).
func TestReason(t *testing.T) {
	syscall := []string{"do_syscall_64", "entry_SYSCALL_64_after_hwframe"}
	for _, tt := range []struct {
		want     string
		frames   string
		runnable bool
	}{
		{ReasonSleep, "__schedule schedule do_nanosleep hrtimer_nanosleep common_nsleep __x64_sys_clock_nanosleep", false},
		{ReasonPipe, "__schedule schedule anon_pipe_read vfs_read ksys_read", false},
		{ReasonPipe, "__schedule schedule pipe_read vfs_read ksys_read", false},
		{ReasonFutex, "__schedule schedule futex_wait_queue __futex_wait futex_wait do_futex __x64_sys_futex", false},
		{ReasonFutex, "__schedule schedule futex_wait_queue_me.isra.0 futex_wait do_futex", false},
		{ReasonIO, "__schedule schedule io_schedule folio_wait_bit folio_wait_writeback __filemap_fdatawait_range file_write_and_wait_range generic_buffers_fsync_noflush ext4_sync_file do_fsync __x64_sys_fsync", false},
		{ReasonIO, "__schedule schedule schedule_timeout io_schedule_timeout wait_for_completion_io_timeout submit_bio_wait blkdev_issue_flush ext4_sync_file do_fsync", false},
		{ReasonPageFault, "__schedule schedule io_schedule folio_wait_bit_common filemap_fault __do_fault do_fault handle_mm_fault do_user_addr_fault exc_page_fault asm_exc_page_fault", false},
		{ReasonSocket, "__schedule schedule schedule_timeout unix_stream_read_generic unix_stream_recvmsg sock_recvmsg __sys_recvfrom", false},
		{ReasonSocket, "__schedule schedule schedule_timeout wait_woken sk_wait_data tcp_recvmsg_locked tcp_recvmsg inet_recvmsg sock_read_iter vfs_read", false},
		{ReasonPoll, "__schedule schedule schedule_hrtimeout_range_clock do_epoll_wait do_epoll_pwait.part.0 __x64_sys_epoll_pwait", false},
		{ReasonPoll, "__schedule schedule schedule_hrtimeout_range do_sys_poll __x64_sys_poll", false},
		{ReasonTTY, "__schedule schedule schedule_timeout wait_woken n_tty_read tty_read vfs_read", false},
		{ReasonKernelLock, "__schedule schedule schedule_preempt_disabled __mutex_lock.constprop.0 do_truncate", false},
		{ReasonKernelLock, "__schedule schedule rwsem_down_write_slowpath down_write do_mprotect_pkey", false},
		{ReasonChild, "__schedule schedule do_wait kernel_wait4 __do_sys_wait4", false},
		{ReasonSignal, "__schedule schedule __do_sys_pause", false},
		{ReasonOther, "__schedule schedule do_signal_stop get_signal arch_do_signal_or_restart", false},
		{ReasonPreempted, "__schedule schedule irqentry_exit_to_user_mode asm_sysvec_apic_timer_interrupt", true},
		{ReasonPreempted, "__schedule schedule futex_wait_queue futex_wait", true},
		{ReasonUnknown, "", false},
	} {
		frames := strings.Fields(tt.frames)
		if len(frames) > 0 {
			frames = append(frames, syscall...)
		}
		if got := Reason(frames, tt.runnable); got != tt.want {
			t.Errorf("Reason(%s, runnable %v) = %s, want %s", tt.frames, tt.runnable, got, tt.want)
		}
	}
}

func TestConfig(t *testing.T) {
	c := Config{Enabled: true}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Probability != DefaultProbability || c.Uninterruptible != DefaultUninterruptible || c.Preempted != DefaultPreempted || c.MaxWaits != DefaultMaxWaits || c.MaxStacks != DefaultMaxStacks {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []Config{
		{Probability: 0, Uninterruptible: 0.5, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, Preempted: 0, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, Preempted: 1.5, MaxWaits: 100, MaxStacks: 100},
		{Probability: math.NaN(), Uninterruptible: 0.5, MaxWaits: 100, MaxStacks: 100},
		{Probability: 1.01, Uninterruptible: 0.5, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, MinWait: -time.Second, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, MinWait: 2 * time.Hour, MaxWaits: 100, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, MaxWaits: 1, MaxStacks: 100},
		{Probability: 0.5, Uninterruptible: 0.5, MaxWaits: 100, MaxStacks: 1 << 21},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	// The fixed point the eBPF side weighs with: never 0, 1 stays 1.
	for p, k := range map[float64]uint32{1: One, 0.001: 66, 1.0 / One: 1, 0.5: One / 2} {
		c := Config{Probability: p}
		if got := c.FloorK(); got != k {
			t.Errorf("FloorK(%v) = %d, want %d", p, got, k)
		}
	}
	c = Config{Probability: 0.8, Uninterruptible: 0.5}
	if got := c.FloorUninterruptibleK(); got != c.FloorK() {
		t.Errorf("uninterruptible floor %d under the floor %d", got, c.FloorK())
	}
	c = Config{Probability: 0.8, Preempted: 0.05}
	if got := c.FloorPreemptedK(); got != c.FloorK() {
		t.Errorf("preempted floor %d under the floor %d", got, c.FloorK())
	}
}
