package frame

import semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

// Attribute keys of the frame format (docs/frame-format.md). Keys that
// OpenTelemetry's semantic conventions define come from them; the rest are
// profsym's or pprof's own.
const (
	// Resource.
	AttrPID         = string(semconv.ProcessPIDKey)
	AttrExePath     = string(semconv.ProcessExecutablePathKey)
	AttrExeName     = string(semconv.ProcessExecutableNameKey)
	AttrContainerID = string(semconv.ContainerIDKey)
	// What the cgroup path and /proc/PID/status say beyond the id
	// (docs/frame-format.md): k8sattributes associates pods by the first.
	AttrK8sPodUID        = string(semconv.K8SPodUIDKey)
	AttrContainerRuntime = string(semconv.ContainerRuntimeNameKey)
	AttrVPID             = string(semconv.ProcessVpidKey)
	AttrHostName         = string(semconv.HostNameKey)
	AttrKernelRelease    = "os.kernel.release" // not in semconv; `uname -r`

	// Resource: who sent a profile (JFR intakes, docs/jfr.md).
	AttrServiceName           = string(semconv.ServiceNameKey)
	AttrServiceVersion        = string(semconv.ServiceVersionKey)
	AttrServiceInstanceID     = string(semconv.ServiceInstanceIDKey)
	AttrDeploymentEnvironment = string(semconv.DeploymentEnvironmentNameKey)
	AttrRuntimeName           = string(semconv.ProcessRuntimeNameKey)
	AttrRuntimeVersion        = string(semconv.ProcessRuntimeVersionKey)
	AttrRuntimeDescription    = string(semconv.ProcessRuntimeDescriptionKey)
	AttrSDKLanguage           = string(semconv.TelemetrySDKLanguageKey)

	// Sample.
	AttrThreadID   = string(semconv.ThreadIDKey)
	AttrThreadName = string(semconv.ThreadNameKey)
	AttrCPU        = string(semconv.CPULogicalNumberKey)
	// AttrUnwindStop marks a sample whose user stack the unwinder could not
	// walk exactly: why (docs/unwinding.md). Whole stacks carry none.
	AttrUnwindStop = "profsym.unwind.stop_reason"
	// AttrOffCPUReason says why the thread of an off_cpu sample waited
	// (futex, sleep, io, ...; docs/off-cpu.md), read from its kernel frames.
	AttrOffCPUReason = "profsym.off_cpu.reason"
	// AttrOffCPUWaits is the number of waits an off_cpu sample's value was
	// estimated from, AttrOffCPUStderr that estimate's standard error in
	// ns (absent when every wait was recorded for sure: the value is exact).
	AttrOffCPUWaits  = "profsym.off_cpu.waits"
	AttrOffCPUStderr = "profsym.off_cpu.stderr_ns"
	// Trace context of a sample whose trace id is unknown (JFR profilers
	// record span ids only; docs/frame-format.md): semconv has no key for
	// them, so these are the labels span-aware profile stores read
	// (Pyroscope's span_id and span_name), as 16 lowercase hex digits.
	AttrSpanID          = "span_id"
	AttrLocalRootSpanID = "local_root_span_id"
	AttrSpanName        = "span_name"
	// AttrPprofLabelPrefix + key is a pprof label of the sample (Go's
	// runtime/pprof labels: pprof.Do, SetGoroutineLabels).
	AttrPprofLabelPrefix = "pprof.label."

	// Mapping: the identity of the mapped file.
	AttrBuildIDGNU = string(semconv.ProcessExecutableBuildIDGNUKey)
	AttrBuildIDGo  = string(semconv.ProcessExecutableBuildIDGoKey)
	AttrBuildIDHTL = string(semconv.ProcessExecutableBuildIDHtlhashKey)

	// Location.
	AttrFrameType = string(semconv.ProfileFrameTypeKey)
	// AttrError says why a location stayed raw (one of the reasons below).
	AttrError = "profsym.symbolization.error"
	// AttrIncomplete is on a named location whose lines are missing
	// although its binary has debug info: the reason that debug info could
	// not be used (limit_exceeded, corrupt_file, ...). The name came from
	// a symbol table.
	AttrIncomplete = "profsym.symbolization.incomplete"

	// AttrAddressBase = AddressBaseImage on a mapping: its locations'
	// addresses are offsets from the image base (JFR remote frames,
	// docs/jfr.md), not ELF addresses.
	AttrAddressBase  = "profsym.mapping.address_base"
	AddressBaseImage = "image"

	// Mapping flags pprof reads, set where symbolization found something.
	AttrHasFunctions    = "pprof.mapping.has_functions"
	AttrHasFilenames    = "pprof.mapping.has_filenames"
	AttrHasLineNumbers  = "pprof.mapping.has_line_numbers"
	AttrHasInlineFrames = "pprof.mapping.has_inline_frames"
)

// Values of AttrFrameType (semconv's profile.frame.type enumeration).
const (
	TypeNative  = "native"
	TypeKernel  = "kernel"
	TypeGo      = "go"
	TypeJVM     = "jvm"
	TypeCPython = "cpython"
	TypeV8JS    = "v8js"
	TypePHP     = "php"
	TypePerl    = "perl"
	TypeRuby    = "ruby"
	TypeDotnet  = "dotnet"
)

// Pseudo file names of mappings without a file.
const (
	FileKernel = "[kernel.kallsyms]"
	FileJIT    = "[jit]"
)
