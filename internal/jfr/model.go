package jfr

// Kind is the profile a sample event belongs to.
type Kind uint8

const (
	KindCPU    Kind = iota // jdk.ExecutionSample, datadog.ExecutionSample
	KindWall               // datadog.MethodSample, profiler.WallClockSample
	KindAlloc              // jdk.ObjectAllocationSample, ...InNewTLAB/OutsideTLAB, datadog.ObjectSample
	KindNative             // jdk.NativeMethodSample: threads in native code, sampled on the wall clock
	numKinds
)

// Kinds lists every kind in output order.
var Kinds = []Kind{KindCPU, KindWall, KindAlloc, KindNative}

func (k Kind) String() string {
	switch k {
	case KindCPU:
		return "cpu"
	case KindWall:
		return "wall"
	case KindAlloc:
		return "alloc"
	case KindNative:
		return "native"
	}
	return "unknown"
}

// Sample is one sample event.
type Sample struct {
	Kind      Kind
	EventType string // the JFR event type name
	Time      int64  // Unix nanoseconds
	Thread    int64  // constant-pool id of the thread (0: none)
	Stack     int64  // constant-pool id of the stack trace (0: none)
	State     int64  // constant-pool id of the thread state (0: none)
	// Weight is what the sample stands for: 1 (or the profiler's weight) for
	// CPU and wall samples, bytes for allocation samples.
	Weight int64
	// Trace context: the span the thread was in (the Datadog profiler's
	// spanId and localRootSpanId; Pyroscope's spanId, and spanName, an id
	// into the upload's label strings). 0 when none.
	SpanID          int64
	LocalRootSpanID int64
	SpanName        int64
	ContextID       int64 // Pyroscope's label context
	// Attrs are the Datadog profiler's context attributes (fields of type
	// profiler.types.AttributeValue it appends to sample events), the ones
	// set on this sample; valid only during the Sample callback.
	Attrs []Attr
}

// Attr is a context attribute: its field name and the constant-pool id of
// its value (Chunk.AttributeValue).
type Attr struct {
	Name  string
	Value int64
}

// NativeLibrary is a jdk.NativeLibrary event, with the Datadog profiler's
// optional build id and load bias.
type NativeLibrary struct {
	Name                    string
	BaseAddress, TopAddress uint64
	BuildID                 string // as recorded: validate before use
	LoadBias                uint64
	HasBuildID, HasLoadBias bool
}

// JVMInfo is what jdk.JVMInformation says about the process.
type JVMInfo struct {
	PID              int64
	JVMName, Version string
	JavaArguments    string
}

// StackTrace is a constant-pool stack trace, leaf first.
type StackTrace struct {
	Truncated bool
	Frames    []Frame
}

// Frame is one frame of a stack trace.
type Frame struct {
	Method int64 // constant-pool id of the method
	Line   int32
	BCI    int32
	Type   int64 // frame type: a constant-pool id, or a raw number not in the pool
}

// Method is a constant-pool method.
type Method struct {
	Class      int64
	Name       int64 // symbol id
	Descriptor int64 // symbol id
	Modifiers  int32
	Hidden     bool
}

// Thread is a constant-pool thread.
type Thread struct {
	OSName       string
	OSThreadID   int64
	JavaName     string
	JavaThreadID int64
}

type classEntry struct {
	name int64 // symbol id
	pkg  int64
}

type threadEntry struct {
	osName, javaName str
	osTID, javaTID   int64
}
