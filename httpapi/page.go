package httpapi

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"chessd/domain"
)

// page is where a list (GET /jobs, GET /disputes, newest first) starts and how much of
// it one answer holds.
type page struct {
	limit int
	after *domain.PageCursor
}

// read takes the query parameter name=v when it is the page's (limit, cursor) and
// reports whether it was; a bad value is added to p. idPrefix is the listed ids' own.
func (pg *page) read(p *domain.Problems, name, v string, maxLimit int, idPrefix string) bool {
	switch name {
	case "limit":
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			p.Add("limit", fmt.Sprintf("must be an integer from 1 to %d", maxLimit))
		}
		pg.limit = n
	case "cursor":
		c, err := domain.DecodePageCursor(v, idPrefix)
		var de *domain.Error
		if errors.As(err, &de) {
			*p = append(*p, de.Fields...)
		}
		pg.after = &c
	default:
		return false
	}
	return true
}

// nextPage links the page after this one (Link rel="next", the same query with its
// cursor) and returns its cursor for the body's next_cursor; nil on the last page.
func (s *Server) nextPage(w http.ResponseWriter, path string, q url.Values, next *domain.PageCursor) *string {
	if next == nil {
		return nil
	}
	c := next.Encode()
	q.Set("cursor", c)
	w.Header().Set("Link", fmt.Sprintf(`<%s%s?%s>; rel="next"`, s.baseURL, path, q.Encode()))
	return &c
}

// eachParam calls f with each query parameter of a list and its value, in name order
// (so that problems come in one order), adding to p the names given more than once.
func eachParam(q url.Values, p *domain.Problems, f func(name, v string)) {
	for _, name := range slices.Sorted(maps.Keys(q)) {
		vs := q[name]
		if len(vs) > 1 {
			p.Add(name, "is given more than once")
		}
		f(name, vs[0])
	}
}
