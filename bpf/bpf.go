// Package bpf holds profsym's eBPF programs and their generated Go bindings.
//
// The object files and bindings are committed so that building profsym needs
// no clang; CI regenerates them with `go generate ./bpf` and checks that they
// are byte-identical. vmlinux.h is hand-written (CO-RE) rather than dumped from
// the build machine's kernel, so the output does not depend on that kernel.
package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror" -target amd64,arm64 -type sample_key -type sample_value -type rb_sample -type stats -type proc_event -type unwind_row -type unwind_table -type unwind_mapping -type unwind_proc -type user_stack -type stop_reason -type sample_origin -type proc_event_kind -type table_state -type table_slot -type row_kind -type cfa_rule -type stack_word_bits -type runtime_kind -type walk_prog -type stack_copy -type frame_kind -type unwind_limits -type row_bits -type cpython_proc -type cpython_counters -type cpython_frame_kind -type cpython_layout -type cpython_limits -type cpython_error -type cpython_flags -type hotspot_proc -type hotspot_frame_kind -type hotspot_limits -type hotspot_error -type hotspot_flags -type kernel_stack -type offcpu_flags -type offcpu_key -type offcpu_limits -type offcpu_stats -type offcpu_value -type offcpu_wait Profile profile.c

// Other CPUs get the same Go types and constants (the CLI and the
// symbolization processor build everywhere), from an object compiled with
// x86-64's registers that is never loaded: the sampler runs on amd64 and
// arm64 only and says so elsewhere.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -D__TARGET_ARCH_x86" -target bpfel,bpfeb -tags "!386,!amd64,!arm64" -output-stem profile_types -type sample_key -type sample_value -type rb_sample -type stats -type proc_event -type unwind_row -type unwind_table -type unwind_mapping -type unwind_proc -type user_stack -type stop_reason -type sample_origin -type proc_event_kind -type table_state -type table_slot -type row_kind -type cfa_rule -type stack_word_bits -type runtime_kind -type walk_prog -type stack_copy -type frame_kind -type unwind_limits -type row_bits -type cpython_proc -type cpython_counters -type cpython_frame_kind -type cpython_layout -type cpython_limits -type cpython_error -type cpython_flags -type hotspot_proc -type hotspot_frame_kind -type hotspot_limits -type hotspot_error -type hotspot_flags -type kernel_stack -type offcpu_flags -type offcpu_key -type offcpu_limits -type offcpu_stats -type offcpu_value -type offcpu_wait Profile profile.c
