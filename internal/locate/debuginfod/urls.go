package debuginfod

import (
	"fmt"
	"net/url"
	"strings"
)

// ParseURLs splits a DEBUGINFOD_URLS value into server prefixes. Entries are
// separated by any white space (profile scripts join *.urls files with
// newlines or spaces). Only http and https prefixes are kept: file:// and
// elfutils' "ima:" policy words have no meaning for this client. Trailing
// slashes are trimmed and duplicates dropped, keeping the first.
func ParseURLs(s string) []string {
	var out []string
	for _, f := range strings.Fields(s) {
		if u, err := normalizeURL(f); err == nil {
			out = appendUnique(out, u)
		}
	}
	return out
}

// normalizeURL accepts an absolute http(s) URL prefix and trims trailing
// slashes so that "/buildid/..." can be appended.
func normalizeURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("debuginfod: server URL %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("debuginfod: server URL %q is not http(s)://HOST[/PREFIX]", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("debuginfod: server URL %q has a query or fragment", s)
	}
	return strings.TrimRight(s, "/"), nil
}

func appendUnique(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}
