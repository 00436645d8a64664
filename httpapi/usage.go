package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"chessd/domain"
	"chessd/ledger"
)

// usage answers GET /usage from the charges read model.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var p domain.Problems
	var dims []string
	if g := q.Get("group_by"); g != "" {
		seen := map[string]bool{}
		for _, name := range strings.Split(g, ",") {
			name = strings.TrimSpace(name)
			if !ledger.IsUsageGroup(name) {
				p.Add("group_by", fmt.Sprintf("unknown group %q (key, day, endpoint, engine, env)", name))
				continue
			}
			if !seen[name] {
				dims, seen[name] = append(dims, name), true
			}
		}
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	from, to := today.AddDate(0, 0, -30), today
	for _, d := range []struct {
		name string
		dst  *time.Time
	}{{"from", &from}, {"to", &to}} {
		if v := q.Get(d.name); v != "" {
			t, err := time.Parse(time.DateOnly, v)
			if err != nil {
				p.Add(d.name, "must be a date, YYYY-MM-DD (UTC)")
				continue
			}
			*d.dst = t
		}
	}
	if to.Before(from) {
		p.Add("to", "is before from")
	}
	for name := range q {
		if name != "group_by" && name != "from" && name != "to" {
			p.Add(name, "is not a parameter of /usage")
		}
	}
	if err := p.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	key := principal(r.Context())
	env := ""
	if key.Env() == domain.EnvTest { // a test key sees the test book only
		env = domain.EnvTest.String()
	}
	rep, err := ledger.Usage(r.Context(), s.pool, ledger.UsageQuery{AccountID: key.AccountID(), Env: env, From: from, To: to, GroupBy: dims})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	groups := []map[string]any{}
	for _, g := range rep.Groups {
		m := map[string]any{"calls": g.Calls, "units": g.Units, "usd": usd(g.USD)}
		for i, d := range dims {
			m[d] = g.Values[i]
		}
		groups = append(groups, m)
	}
	type total struct {
		Calls int64  `json:"calls"`
		Units int64  `json:"units"`
		USD   string `json:"usd"`
	}
	if dims == nil {
		dims = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"from": from.Format(time.DateOnly), "to": to.Format(time.DateOnly), "group_by": dims,
		"groups": groups, "totals": total{Calls: rep.Calls, Units: rep.Units, USD: usd(rep.USD)},
	})
}
