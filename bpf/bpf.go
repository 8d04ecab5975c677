// Package bpf holds profsym's eBPF programs and their generated Go bindings.
//
// The object files and bindings are committed so that building profsym needs
// no clang; CI regenerates them with `go generate ./bpf` and checks that they
// are byte-identical. vmlinux.h is hand-written (CO-RE) rather than dumped from
// the build machine's kernel, so the output does not depend on that kernel.
package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror" -target amd64,arm64 -type sample_key -type sample_value -type rb_sample -type stats -type proc_event -type unwind_row -type unwind_table -type unwind_mapping -type unwind_proc -type user_stack Profile profile.c
