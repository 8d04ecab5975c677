package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/receiverhelper"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/jfr"
	"github.com/profsym/profsym/internal/otlp/jfrconv"
	"github.com/profsym/profsym/receiver/jfrreceiver/internal/metadata"
)

// Outcomes of an upload (the outcome attribute).
const (
	outcomeOK         = "ok"
	outcomeBadRequest = "bad_request"
	outcomeTooLarge   = "too_large"
	outcomeRefused    = "refused"
)

// Bounds on the small parts of an upload.
const (
	maxEventJSON   = 1 << 20  // Datadog's event part
	maxLabelsPart  = 16 << 20 // Pyroscope's labels part, decompressed
	maxRecordings  = 8        // JFR attachments in one upload
	maxParts       = 64
	maxTagParts    = 256
	maxConcurrency = 4 // uploads converted at once: each holds a recording in memory
)

type jfrReceiver struct {
	cfg  *Config
	set  receiver.Settings
	log  *zap.Logger
	tel  *metadata.TelemetryBuilder
	obs  *receiverhelper.ObsReport
	next xconsumer.Profiles
	sem  chan struct{}

	mu    sync.Mutex
	srv   *http.Server
	bound net.Addr
	wg    sync.WaitGroup
}

func newReceiver(cfg *Config, set receiver.Settings, next xconsumer.Profiles) (*jfrReceiver, error) {
	tel, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	// The standard otelcol_receiver_accepted/refused_profile_samples.
	obs, err := receiverhelper.NewObsReport(receiverhelper.ObsReportSettings{ReceiverID: set.ID, Transport: "http", ReceiverCreateSettings: set})
	if err != nil {
		return nil, err
	}
	return &jfrReceiver{cfg: cfg, set: set, log: set.Logger, tel: tel, obs: obs, next: next, sem: make(chan struct{}, maxConcurrency)}, nil
}

func (r *jfrReceiver) Start(ctx context.Context, host component.Host) error {
	mux := http.NewServeMux()
	if r.cfg.Datadog.Enabled {
		mux.HandleFunc(r.cfg.Datadog.Path, r.handler("datadog", r.readDatadog))
	}
	if r.cfg.Pyroscope.Enabled {
		mux.HandleFunc(r.cfg.Pyroscope.Path, r.handler("pyroscope", r.readPyroscope))
	}
	ln, err := r.cfg.ToListener(ctx)
	if err != nil {
		return fmt.Errorf("jfr receiver: listening on %s: %w", r.cfg.NetAddr.Endpoint, err)
	}
	srv, err := r.cfg.ToServer(ctx, host.GetExtensions(), r.set.TelemetrySettings, mux)
	if err != nil {
		ln.Close()
		return err
	}
	r.mu.Lock()
	r.srv, r.bound = srv, ln.Addr()
	r.mu.Unlock()
	r.log.Info("jfr receiver listening", zap.String("endpoint", ln.Addr().String()))
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			componentstatus.ReportStatus(host, componentstatus.NewFatalErrorEvent(err))
		}
	}()
	return nil
}

func (r *jfrReceiver) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Shutdown(ctx)
		r.wg.Wait()
	}
	r.tel.Shutdown()
	return err
}

// Addr is the address the server listens on (tests start on port 0).
func (r *jfrReceiver) Addr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bound
}

// httpError is an upload's failure: the status to answer and the outcome
// to count.
type httpError struct {
	status  int
	outcome string
	err     error
}

func (e *httpError) Error() string { return e.err.Error() }

func badRequest(format string, args ...any) *httpError {
	return &httpError{http.StatusBadRequest, outcomeBadRequest, fmt.Errorf(format, args...)}
}

// classify turns a read or parse error into a status: limits and bombs are
// 413, anything else the client sent is 400.
func classify(err error, what string) *httpError {
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || errors.Is(err, jfr.ErrLimit) {
		return &httpError{http.StatusRequestEntityTooLarge, outcomeTooLarge, fmt.Errorf("%s: %w", what, err)}
	}
	return &httpError{http.StatusBadRequest, outcomeBadRequest, fmt.Errorf("%s: %w", what, err)}
}

// upload is one request's recordings and what describes them.
type upload struct {
	recordings [][]byte
	resource   map[string]any
	labels     map[int64]map[string]string
	strings    map[int64]string
	execKind   jfr.Kind
}

// handler serves one intake: POST only, at most maxConcurrency uploads
// held at once, read by read, converted and passed on.
func (r *jfrReceiver) handler(intake string, read func(*http.Request) (*upload, *httpError)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if !r.acquire(req.Context()) {
			return
		}
		defer r.release()
		up, herr := read(req)
		r.finish(w, req, intake, start, up, herr)
	}
}

func (r *jfrReceiver) finish(w http.ResponseWriter, req *http.Request, intake string, start time.Time, up *upload, herr *httpError) {
	if herr == nil {
		herr = r.convert(req.Context(), up, intake)
	}
	outcome := outcomeOK
	if herr != nil {
		outcome = herr.outcome
		r.log.Debug("jfr upload rejected", zap.String("intake", intake), zap.String("remote", req.RemoteAddr), zap.Error(herr.err))
		http.Error(w, herr.Error(), herr.status)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	r.tel.ReceiverJfrUploads.Add(req.Context(), 1, metric.WithAttributes(
		attribute.String("intake", intake), attribute.String("outcome", outcome)))
	r.tel.ReceiverJfrConversionDuration.Record(req.Context(), time.Since(start).Seconds())
}

// convert turns an upload's recordings into one Profiles and passes it on.
func (r *jfrReceiver) convert(ctx context.Context, up *upload, intake string) *httpError {
	all := pprofile.NewProfiles()
	for i, rec := range up.recordings {
		r.tel.ReceiverJfrRecordingBytes.Add(ctx, int64(len(rec)))
		lim := jfr.DefaultLimits()
		lim.MaxChunkSize = r.cfg.MaxChunkSize
		pd, st, err := jfrconv.ConvertBytes(rec, jfrconv.Options{Limits: lim, ExecutionSampleKind: up.execKind,
			Resource: up.resource, Labels: up.labels, Strings: up.strings, ScopeVersion: r.set.BuildInfo.Version})
		if err != nil {
			return classify(err, fmt.Sprintf("recording %d", i+1))
		}
		if len(st.Ignored) > 0 {
			// Two sources of one profile (docs/jfr.md): the profile is made
			// of one, the others' events are left out.
			r.log.Debug("jfr recording has more than one source of a profile", zap.String("intake", intake),
				zap.Any("sources", st.Source), zap.Any("ignored_events", st.Ignored))
		}
		for ev, n := range st.Ignored {
			r.tel.ReceiverJfrEventsLeftOut.Add(ctx, n, metric.WithAttributes(attribute.String("event", ev)))
		}
		for k, v := range st.Samples {
			r.tel.ReceiverJfrSamples.Add(ctx, v, metric.WithAttributes(attribute.String("profile", k.String())))
		}
		r.tel.ReceiverJfrRemoteFrames.Add(ctx, st.RemoteFrames)
		r.tel.ReceiverJfrInvalidRemoteFrames.Add(ctx, st.InvalidRemote)
		if i == 0 {
			all = pd
		} else if err := pd.MergeTo(all); err != nil {
			return &httpError{http.StatusInternalServerError, outcomeRefused, err}
		}
	}
	if all.SampleCount() == 0 {
		return nil // nothing sampled: accepted, nothing to send
	}
	ctx = r.obs.StartProfilesOp(ctx)
	err := r.next.ConsumeProfiles(ctx, all)
	r.obs.EndProfilesOp(ctx, "jfr", all.SampleCount(), err)
	if err != nil {
		if consumererror.IsPermanent(err) {
			return &httpError{http.StatusBadRequest, outcomeRefused, err}
		}
		return &httpError{http.StatusServiceUnavailable, outcomeRefused, err}
	}
	return nil
}

// acquire bounds the uploads held in memory at once.
func (r *jfrReceiver) acquire(ctx context.Context) bool {
	select {
	case r.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *jfrReceiver) release() { <-r.sem }

// readRecording reads a JFR attachment (bounded by the request body limit
// that confighttp enforces) and undoes its compression within
// max_recording_size.
func (r *jfrReceiver) readRecording(part io.Reader) ([]byte, error) {
	limit := r.cfg.MaxRequestBodySize
	if limit <= 0 {
		limit = DefaultMaxBodySize
	}
	b, err := io.ReadAll(io.LimitReader(part, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("attachment larger than %d bytes: %w", limit, jfr.ErrLimit)
	}
	return jfr.Decompress(b, r.cfg.MaxRecordingSize)
}

func isMultipart(req *http.Request) bool {
	mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	return err == nil && strings.HasPrefix(mt, "multipart/")
}

func readSmall(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("part larger than %d bytes: %w", max, jfr.ErrLimit)
	}
	return b, nil
}

// eachPart walks a multipart request's parts (at most maxParts), handing
// each to f; parts f does not read are drained.
func eachPart(req *http.Request, f func(p *multipart.Part) *httpError) *httpError {
	mr, err := req.MultipartReader()
	if err != nil {
		return badRequest("multipart: %v", err)
	}
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return classify(err, "multipart")
		}
		if n >= maxParts {
			return badRequest("more than %d parts", maxParts)
		}
		if herr := f(part); herr != nil {
			return herr
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			return classify(err, "multipart")
		}
	}
}
