package symstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// Protocol paths. Reads are the debuginfod protocol; the batch query and
// uploads are profsym's.
const (
	PathMissing = "/symbols/v1/missing"
	// PathStatus reports the store's generation, which moves whenever it
	// gains files: a gateway reading the store over HTTP polls it to retry
	// frames that failed before an upload.
	PathStatus = "/symbols/v1/status"
	// PathIndex + "/ID" serves and takes the symbol index of a GNU build
	// id: gateways reading this store over HTTP share the indexes they
	// build. It is profsym's own route; the debuginfod paths never reach
	// an index.
	PathIndex = "/symbols/v1/symindex"
	// HeaderLease carries the lease token with an upload (of an index: the
	// index lease).
	HeaderLease = "X-Profsym-Lease"
	// maxQueryBody bounds the JSON of one missing query: ids of at most 128
	// hex digits plus quoting.
	maxQueryBody = 140
)

// MissingRequest is the body of POST PathMissing.
type MissingRequest struct {
	BuildIDs []string `json:"build_ids"`
	// Lease asks for upload leases on the missing ids.
	Lease bool `json:"lease"`
	// Held maps ids of BuildIDs to the lease tokens this client was given
	// for them: those leases are renewed rather than answered "pending".
	Held map[string]string `json:"held,omitempty"`
	// Kind "" asks about debug files and hands out upload leases; Kind
	// "symindex" asks about symbol indexes (an id is missing when no index
	// is stored) and hands out and renews index leases (GNU build ids only).
	Kind Kind `json:"kind,omitempty"`
}

// Handler serves the store:
//
//	GET|HEAD /buildid/ID/debuginfo|executable     debuginfod, with ranges
//	GET|HEAD /gobuildid/HEX/debuginfo|executable  the same by Go build id (its bytes in hex)
//	PUT|POST /buildid/ID/..., /gobuildid/HEX/...  upload (body: the ELF file)
//	POST     /symbols/v1/missing                   {"build_ids":[...],"lease":true}
//	GET      /symbols/v1/status                    {"generation":N,"files":N,"bytes":N}
//	GET|HEAD /symbols/v1/symindex/ID               a stored symbol index
//	PUT|POST /symbols/v1/symindex/ID               store one (X-Profsym-Lease: its index lease)
//	DELETE   /symbols/v1/symindex/ID               give the index lease back (X-Profsym-Lease)
//
// The path is split by hand on its escaped form, so an id such as
// "..%2F..%2Fetc" reaches validation (and a 400) instead of being cleaned
// or redirected by a mux; no path is ever built from it.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.EscapedPath()
		ns, rest, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		switch {
		case p == PathMissing:
			s.serveMissing(w, r)
		case p == PathStatus:
			s.serveStatus(w, r)
		case strings.HasPrefix(p, PathIndex+"/"):
			s.serveIndex(w, r, strings.TrimPrefix(p, PathIndex+"/"))
		case ns == string(NSBuildID) || ns == string(NSGoBuildID):
			parts := strings.Split(rest, "/")
			if len(parts) != 2 {
				s.fail(w, reject(ReasonInvalidBuildID, http.StatusBadRequest, fmt.Errorf("want /%s/ID/debuginfo or /%s/ID/executable", ns, ns)))
				return
			}
			id, err := parseID(parts[0])
			if err != nil {
				s.obs.Rejected(ReasonInvalidBuildID)
				s.fail(w, reject(ReasonInvalidBuildID, http.StatusBadRequest, err))
				return
			}
			key := ns + "/" + id
			switch r.Method {
			case http.MethodGet, http.MethodHead:
				s.serveFile(w, r, key, parts[1])
			case http.MethodPut, http.MethodPost:
				s.serveUpload(w, r, key, parts[1])
			default:
				w.Header().Set("Allow", "GET, HEAD, PUT, POST")
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			}
		default:
			http.NotFound(w, r)
		}
	})
}

func (s *Store) fail(w http.ResponseWriter, err error) {
	var re *RejectError
	if errors.As(err, &re) {
		w.Header().Set("X-Profsym-Reason", re.Reason)
		if re.Status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "10")
		}
		http.Error(w, re.Error(), re.Status)
		return
	}
	s.log.Warn("symbol store: request failed", zap.Error(err))
	http.Error(w, "internal error", http.StatusInternalServerError)
}

func (s *Store) serveMissing(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	limit := 2*int64(s.cfg.MaxQueryIDs)*maxQueryBody + 64 // ids, and as many held
	body := http.MaxBytesReader(w, r.Body, limit)
	var req MissingRequest
	if err := json.NewDecoder(body).Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.obs.Rejected(ReasonTooLarge)
			s.fail(w, reject(ReasonTooLarge, http.StatusRequestEntityTooLarge, fmt.Errorf("query over %d bytes", limit)))
			return
		}
		s.obs.Rejected(ReasonBadRequest)
		s.fail(w, reject(ReasonBadRequest, http.StatusBadRequest, fmt.Errorf("query: %v", err)))
		return
	}
	s.Refresh(r.Context())
	res, err := s.Query(r.Context(), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

func (s *Store) serveFile(w http.ResponseWriter, r *http.Request, rawKey, rawKind string) {
	kind, ok := ParseKind(rawKind)
	if !ok {
		http.NotFound(w, r) // debuginfod's /source and /section are not served
		return
	}
	key, err := ParseKey(rawKey)
	if err != nil {
		s.obs.Rejected(ReasonInvalidBuildID)
		s.fail(w, reject(ReasonInvalidBuildID, http.StatusBadRequest, err))
		return
	}
	s.serveObject(w, r, key, kind)
}

// serveObject serves a stored file, or 404.
func (s *Store) serveObject(w http.ResponseWriter, r *http.Request, key Key, kind Kind) {
	o, err := s.be.Open(r.Context(), key, kind)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			http.NotFound(w, r)
			return
		}
		s.fail(w, err)
		return
	}
	defer o.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Debuginfod-Size", strconv.FormatInt(o.Size(), 10))
	// ServeContent handles Range and If-Modified-Since; over an *os.File
	// its copy to the connection is a sendfile.
	http.ServeContent(w, r, "", o.ModTime(), o)
	if r.Method == http.MethodGet {
		s.obs.Served(kind, o.Size())
	}
}

func (s *Store) serveUpload(w http.ResponseWriter, r *http.Request, rawKey, rawKind string) {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	res, err := s.Put(r.Context(), rawKey, rawKind, body, r.ContentLength, r.Header.Get(HeaderLease))
	if err != nil {
		s.fail(w, err)
		return
	}
	if res.Stored {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "stored\n")
		return
	}
	io.WriteString(w, "already stored\n")
}

// Status is the answer of GET PathStatus.
type Status struct {
	Generation uint64 `json:"generation"`
	Files      int64  `json:"files"`
	Bytes      int64  `json:"bytes"`
}

func (s *Store) serveStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	n, b := s.Size()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(Status{Generation: s.Generation(), Files: n, Bytes: b})
}

// parseID unescapes one path segment. Validation proper is
// frame.ParseBuildID, in the store.
func parseID(seg string) (string, error) {
	if strings.ContainsAny(seg, "%/\\") || seg == "." || seg == ".." {
		return "", fmt.Errorf("build id %.80q is not hex", seg)
	}
	return seg, nil
}
