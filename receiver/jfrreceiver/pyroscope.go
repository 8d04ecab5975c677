package jfrreceiver // import "github.com/profsym/profsym/receiver/jfrreceiver"

import (
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/jfr"
)

// readPyroscope reads an upload to Pyroscope's ingest: POST /ingest?format=jfr&name=
// app{k=v,...}&event=cpu|itimer|wall|alloc..., with the recording as the
// raw body or as the `jfr` part of a multipart form whose `labels` part is
// the agent's LabelsSnapshot (protobuf: label contexts by id).
func (r *jfrReceiver) readPyroscope(req *http.Request) (*upload, *httpError) {
	q := req.URL.Query()
	if f := q.Get("format"); f != "jfr" {
		return nil, badRequest("format %q: this receiver ingests format=jfr", f)
	}
	up := &upload{resource: map[string]any{}}
	app, labels := parseAppName(q.Get("name"))
	if app != "" {
		up.resource[frame.AttrServiceName] = clip(app)
	}
	for k, v := range labels {
		switch k {
		case "service_name":
			up.resource[frame.AttrServiceName] = v
		case "__name__":
		default:
			up.resource[k] = v
		}
	}
	if q.Get("event") == "wall" {
		up.execKind = jfr.KindWall
	}
	if !isMultipart(req) {
		b, err := r.readRecording(req.Body)
		if err != nil {
			return nil, classify(err, "body")
		}
		up.recordings = append(up.recordings, b)
		return up, nil
	}
	herr := eachPart(req, func(part *multipart.Part) *httpError {
		switch part.FormName() {
		case "jfr":
			if len(up.recordings) > 0 {
				return badRequest("more than one jfr part")
			}
			b, err := r.readRecording(part)
			if err != nil {
				return classify(err, "jfr part")
			}
			up.recordings = append(up.recordings, b)
		case "labels":
			b, err := readSmall(part, maxLabelsPart)
			if err == nil {
				b, err = jfr.Decompress(b, maxLabelsPart)
			}
			if err != nil {
				return classify(err, "labels part")
			}
			if up.labels, up.strings, err = parseLabels(b); err != nil {
				return badRequest("labels part: %v", err)
			}
		}
		return nil
	})
	if herr != nil {
		return nil, herr
	}
	if len(up.recordings) == 0 {
		return nil, badRequest("no jfr part")
	}
	return up, nil
}

// parseAppName splits Pyroscope's "app.name{key=value,...}".
func parseAppName(s string) (string, map[string]string) {
	app, rest, ok := strings.Cut(s, "{")
	labels := map[string]string{}
	if ok {
		rest = strings.TrimSuffix(rest, "}")
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if ok && k != "" && len(labels) < maxTagParts {
				labels[clip(k)] = clip(v)
			}
		}
	}
	return strings.TrimSpace(app), labels
}

// parseLabels decodes a LabelsSnapshot: contexts (field 1, map of context
// id to Context{labels: map of key string id to value string id}) and
// strings (field 2, map of string id to string), which samples' spanName
// ids also point into.
func parseLabels(b []byte) (map[int64]map[string]string, map[int64]string, error) {
	type ctxLabels map[int64]int64
	contexts := map[int64]ctxLabels{}
	strs := map[int64]string{}
	entries := 0
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		entries++
		if entries > 1<<20 {
			return fmt.Errorf("more than %d entries", 1<<20)
		}
		var key int64
		var val []byte
		var sval string
		if err := eachField(v, func(n protowire.Number, t protowire.Type, fv []byte, x uint64) error {
			switch {
			case n == 1 && t == protowire.VarintType:
				key = int64(x)
			case n == 2 && t == protowire.BytesType:
				val, sval = fv, string(fv)
			}
			return nil
		}); err != nil {
			return err
		}
		switch num {
		case 1:
			cl := ctxLabels{}
			err := eachField(val, func(n protowire.Number, t protowire.Type, fv []byte, _ uint64) error {
				if n != 1 || t != protowire.BytesType {
					return nil
				}
				var lk, lv int64
				if err := eachField(fv, func(n protowire.Number, t protowire.Type, _ []byte, x uint64) error {
					if t == protowire.VarintType && n == 1 {
						lk = int64(x)
					} else if t == protowire.VarintType && n == 2 {
						lv = int64(x)
					}
					return nil
				}); err != nil {
					return err
				}
				if len(cl) < maxTagParts {
					cl[lk] = lv
				}
				return nil
			})
			if err != nil {
				return err
			}
			contexts[key] = cl
		case 2:
			strs[key] = clip(sval)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	out := make(map[int64]map[string]string, len(contexts))
	for id, cl := range contexts {
		m := map[string]string{}
		for k, v := range cl {
			if ks, ok := strs[k]; ok && ks != "" {
				m[ks] = strs[v]
			}
		}
		out[id] = m
	}
	return out, strs, nil
}

// eachField walks one protobuf message's fields.
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte, uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
