module github.com/profsym/profsym

go 1.26

require (
	github.com/cilium/ebpf v0.22.0
	github.com/ianlancetaylor/demangle v0.0.0-20260724033716-83e58baca724
	github.com/klauspost/compress v1.20.3
	github.com/ulikunitz/xz v0.5.17
	go.uber.org/zap v1.28.0
	golang.org/x/sys v0.47.0
)

require go.uber.org/multierr v1.10.0 // indirect
