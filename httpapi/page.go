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
// (so that problems come in one order). Each is one the operation declares, given once:
// declaredOnly refused the others before the handler ran.
func eachParam(q url.Values, f func(name, v string)) {
	for _, name := range slices.Sorted(maps.Keys(q)) {
		f(name, q[name][0])
	}
}

// listEnv is which env a list shows (GET /keys, /jobs, /disputes, /usage/charges,
// /webhooks): the calling key's own unless the list's env parameter names the other.
// Test and live are two worlds: a live key may list either env, a test key only test.
// Only lists take env: a single item of the other env stays 404 like an unknown one.
type listEnv struct {
	key    *domain.Key
	env    domain.Env
	denied bool // a test key asked for live
}

func listEnvOf(key *domain.Key) listEnv { return listEnv{key: key, env: key.Env()} }

// read takes the query parameter name=v when it is env and reports whether it was; a
// bad value is added to p.
func (le *listEnv) read(p *domain.Problems, name, v string) bool {
	if name != "env" {
		return false
	}
	env, ok := domain.ParseEnv(v)
	if !ok {
		p.Add("env", "must be live or test")
		return true
	}
	le.denied = le.key.Env() == domain.EnvTest && env != domain.EnvTest
	le.env = env
	return true
}

// envOnly is the env a list whose one parameter is env shows (GET /keys, /webhooks),
// or its refusal; items names what the list holds.
func envOnly(r *http.Request, items string) (domain.Env, error) {
	le := listEnvOf(principal(r.Context()))
	var p domain.Problems
	if vs, ok := r.URL.Query()["env"]; ok { // declaredOnly lets no other parameter through
		le.read(&p, "env", vs[0])
	}
	if err := p.Err(); err != nil {
		return domain.Env{}, err
	}
	return le.show(items)
}

// show is the env to list, or the refusal (403 missing-scope) of a test key that asked
// for live; items names what the list holds ("jobs"). Bad parameters are answered first.
func (le *listEnv) show(items string) (domain.Env, error) {
	if le.denied {
		return domain.Env{}, domain.Errorf(domain.CodeScope, "a test key sees only test %s", items)
	}
	return le.env, nil
}
