package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"chessd/domain"
)

// usageDims are the group_by names and their columns (a closed list: nothing from the
// query string reaches the SQL text).
var usageDims = map[string]string{
	"key": "key_id", "day": "day", "endpoint": "endpoint", "engine": "engine", "env": "env",
}

// usage answers GET /usage from the charges read model.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var p domain.Problems
	var dims []string
	if g := q.Get("group_by"); g != "" {
		seen := map[string]bool{}
		for _, name := range strings.Split(g, ",") {
			name = strings.TrimSpace(name)
			if _, ok := usageDims[name]; !ok {
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
	cols := make([]string, len(dims))
	for i, d := range dims {
		cols[i] = usageDims[d]
		if d == "day" {
			cols[i] = "to_char(day, 'YYYY-MM-DD')"
		}
	}
	sel := strings.Join(append(cols, "count(*)", "sum(units)", "sum(usd)"), ", ")
	sql := `SELECT ` + sel + ` FROM charges WHERE account_id = $1 AND day BETWEEN $2 AND $3 AND ($4 = '' OR env = $4)`
	if len(cols) > 0 {
		sql += ` GROUP BY ` + strings.Join(cols, ", ") + ` ORDER BY ` + strings.Join(cols, ", ")
	}
	env := ""
	if key.Env() == domain.EnvTest { // a test key sees the test book only
		env = domain.EnvTest.String()
	}
	type total struct {
		Calls int64  `json:"calls"`
		Units int64  `json:"units"`
		USD   string `json:"usd"`
	}
	groups := []map[string]any{}
	var sumCalls, sumUnits int64
	sumUSD := decimal.Zero
	rows, err := s.pool.Query(r.Context(), sql, key.AccountID(), from, to, env)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	for rows.Next() {
		vals := make([]any, len(dims)+3)
		strs := make([]string, len(dims))
		var calls int64
		var units *int64
		var usdSum *decimal.Decimal
		for i := range dims {
			vals[i] = &strs[i]
		}
		vals[len(dims)], vals[len(dims)+1], vals[len(dims)+2] = &calls, &units, &usdSum
		if err := rows.Scan(vals...); err != nil {
			rows.Close()
			s.writeError(w, r, err)
			return
		}
		if calls == 0 {
			continue // no charges at all: the ungrouped sum row
		}
		if len(dims) > 0 { // without group_by there are only the totals
			g := map[string]any{}
			for i, d := range dims {
				g[d] = strs[i]
			}
			g["calls"], g["units"], g["usd"] = calls, *units, usd(*usdSum)
			groups = append(groups, g)
		}
		sumCalls += calls
		sumUnits += *units
		sumUSD = sumUSD.Add(*usdSum)
	}
	if err := rows.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if dims == nil {
		dims = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"from": from.Format(time.DateOnly), "to": to.Format(time.DateOnly), "group_by": dims,
		"groups": groups, "totals": total{Calls: sumCalls, Units: sumUnits, USD: usd(sumUSD)},
	})
}
