package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"

import (
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/profsym/profsym/internal/frame"
)

// ddEvent is the `event` part of a Datadog profile upload (intake v4).
type ddEvent struct {
	Attachments  []string `json:"attachments"`
	TagsProfiler string   `json:"tags_profiler"`
	Family       string   `json:"family"`
	Start        string   `json:"start"`
	End          string   `json:"end"`
}

// Datadog tags mapped to OpenTelemetry resource attributes (semconv names,
// the table in docs/jfr.md); other tags are kept as datadog.tag.<name>.
// runtime-id is one per JVM run, which is what service.instance.id names.
var ddTags = map[string]string{
	"service":         frame.AttrServiceName,
	"env":             frame.AttrDeploymentEnvironment,
	"version":         frame.AttrServiceVersion,
	"host":            frame.AttrHostName,
	"runtime-id":      frame.AttrServiceInstanceID,
	"runtime_version": frame.AttrRuntimeVersion,
	"runtime":         frame.AttrRuntimeName,
}

// readDatadog reads an upload to the Datadog profiling intake: a multipart form with
// an `event` JSON part (tags, attachment names) and the recordings as
// files (main.jfr, auto.jfr), possibly gzip/zstd/lz4 compressed; the older
// form with `tags[]` fields and `data[0]` files is accepted too.
func (r *jfrReceiver) readDatadog(req *http.Request) (*upload, *httpError) {
	if !isMultipart(req) {
		return nil, badRequest("want a multipart/form-data upload, got Content-Type %q", req.Header.Get("Content-Type"))
	}
	up := &upload{resource: map[string]any{}}
	var tags []string
	var ev ddEvent
	herr := eachPart(req, func(part *multipart.Part) *httpError {
		name, file := part.FormName(), part.FileName()
		switch {
		case name == "event":
			b, err := readSmall(part, maxEventJSON)
			if err != nil {
				return classify(err, "event part")
			}
			if err := json.Unmarshal(b, &ev); err != nil {
				return badRequest("event part: %v", err)
			}
		case strings.HasSuffix(file, ".jfr") || name == "main" || name == "auto" || strings.HasPrefix(name, "data["):
			if len(up.recordings) >= maxRecordings {
				return badRequest("more than %d recordings", maxRecordings)
			}
			b, err := r.readRecording(part)
			if err != nil {
				return classify(err, "attachment "+strconv.Quote(name))
			}
			up.recordings = append(up.recordings, b)
		case name == "tags[]":
			b, err := readSmall(part, 4096)
			if err != nil {
				return classify(err, "tags")
			}
			if len(tags) < maxTagParts {
				tags = append(tags, string(b))
			}
		}
		return nil
	})
	if herr != nil {
		return nil, herr
	}
	if len(up.recordings) == 0 {
		return nil, badRequest("no JFR attachment (main.jfr, auto.jfr)")
	}
	for _, t := range strings.Split(ev.TagsProfiler, ",") {
		tags = append(tags, t)
	}
	ddResource(up.resource, tags)
	if ev.Family != "" {
		up.resource[frame.AttrSDKLanguage] = clip(ev.Family)
	}
	return up, nil
}

// ddResource maps "key:value" tags to resource attributes.
func ddResource(res map[string]any, tags []string) {
	n := 0
	for _, t := range tags {
		k, v, ok := strings.Cut(strings.TrimSpace(t), ":")
		if !ok || k == "" || v == "" || n >= maxTagParts {
			continue
		}
		n++
		k, v = clip(k), clip(v)
		if k == "pid" || k == "process_id" {
			if pid, err := strconv.ParseInt(v, 10, 64); err == nil && pid > 0 {
				res[frame.AttrPID] = pid
			}
			continue
		}
		if attr, ok := ddTags[k]; ok {
			res[attr] = v
			continue
		}
		res["datadog.tag."+k] = v
	}
}

// clip bounds a tag's key or value and makes it valid UTF-8.
func clip(s string) string {
	if len(s) > 256 {
		s = s[:256]
	}
	return strings.ToValidUTF8(s, string(utf8.RuneError))
}
