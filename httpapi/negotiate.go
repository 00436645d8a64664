package httpapi

import (
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// acceptOf is r's Accept header: every field line of it, as one list (RFC 9110, 5.3:
// a list header sent in several lines is the lines joined by commas). Header.Get would
// read the first line alone.
func acceptOf(r *http.Request) string { return strings.Join(r.Header.Values("Accept"), ", ") }

// wantsCSV says whether Accept prefers text/csv to JSON. The most specific range
// that matches each type gives its quality; a tie, or no Accept, is JSON.
func wantsCSV(accept string) bool {
	qCSV, qJSON := -1.0, -1.0
	specCSV, specJSON := -1, -1
	for _, r := range acceptRanges(accept) {
		if s := specificity(r.mt, "text", "csv"); s > specCSV {
			specCSV, qCSV = s, r.q
		}
		if s := specificity(r.mt, "application", "json"); s > specJSON {
			specJSON, qJSON = s, r.q
		}
	}
	return qCSV > 0 && qCSV > qJSON
}

// mediaRange is one media range of an Accept header with its quality.
type mediaRange struct {
	mt string
	q  float64
}

// acceptRanges reads an Accept header's media ranges, skipping any that do not parse
// or whose quality is not in [0, 1].
func acceptRanges(accept string) []mediaRange {
	var out []mediaRange
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if q, err = strconv.ParseFloat(v, 64); err != nil || q < 0 || q > 1 {
				continue
			}
		}
		out = append(out, mediaRange{mt, q})
	}
	return out
}

// specificity is how closely media range mt matches typ/sub: 2 exactly, 1 typ/*, 0
// */*, -1 not at all.
func specificity(mt, typ, sub string) int {
	switch mt {
	case typ + "/" + sub:
		return 2
	case typ + "/*":
		return 1
	case "*/*":
		return 0
	}
	return -1
}

// Streamed answers of /eval and /bestmove (docs/API.md, Live evaluation).
const (
	mediaSSE    = "text/event-stream"
	mediaNDJSON = "application/x-ndjson"
)

// streamMedia picks the streamed media type Accept asks for: text/event-stream or
// application/x-ndjson, named exactly (a wildcard never starts a stream) and preferred
// to JSON; "" for the plain JSON answer. At equal quality a type named exactly beats a
// wildcard that matched JSON; JSON named exactly wins the tie, and SSE beats NDJSON.
func streamMedia(accept string) string {
	qSSE, qNDJSON, qJSON := -1.0, -1.0, -1.0
	specJSON := -1
	for _, r := range acceptRanges(accept) {
		switch r.mt {
		case mediaSSE:
			qSSE = r.q
		case mediaNDJSON:
			qNDJSON = r.q
		}
		if s := specificity(r.mt, "application", "json"); s > specJSON {
			specJSON, qJSON = s, r.q
		}
	}
	beats := func(q float64) bool { return q > 0 && (q > qJSON || q == qJSON && specJSON < 2) }
	switch {
	case beats(qSSE) && qSSE >= qNDJSON:
		return mediaSSE
	case beats(qNDJSON):
		return mediaNDJSON
	}
	return ""
}
