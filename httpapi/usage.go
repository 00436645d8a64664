package httpapi

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/ledger"
)

// Pages of /usage: groups per page by default and at most.
const (
	usagePageDefault = 1000
	usagePageMax     = 10000
)

// usageParams are GET /usage's query parameters, checked.
type usageParams struct {
	dims     []string
	zone     *time.Location
	from, to time.Time // [from, to)
	fromText string    // as the answer echoes them
	toText   string
	limit    int
	after    []string
	asOf     time.Time // zero: now
	scope    string    // what its cursors are valid for (usageScope)
}

// asOfMargin is how far in the past an as_of must be: a call's charge commits within
// 30 s of its charged_at, by the clock of the server that answered it, or is forgiven
// (the ledger's settle deadline, docs/BILLING.md "Late charges"); the other 30 s leave
// room for that server's clock and this one's to differ.
const asOfMargin = time.Minute

// dayStart is the first instant in loc of the calendar day day (its year, month and
// day). time.Date puts a midnight that does not exist (a zone whose clocks jump
// forward at 00:00, as America/Santiago's and Atlantic/Azores's do) at 23:00 of the
// day before, which moved an hour of charges into the wrong day; the day then starts
// at the jump.
func dayStart(day time.Time, loc *time.Location) time.Time {
	y, m, d := day.Date()
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if _, _, got := t.Date(); got != d {
		_, t = t.ZoneBounds()
	}
	return t
}

// parseUsage checks /usage's query, reporting every bad parameter at once. Each is one
// GET /usage declares, given once (declaredOnly refused the others).
func parseUsage(q url.Values, now time.Time) (usageParams, error) {
	var p domain.Problems
	u := usageParams{zone: time.UTC, limit: usagePageDefault}
	if v := q.Get("tz"); v != "" {
		// LoadLocation also reads files: only IANA-shaped names reach it
		loc, err := time.LoadLocation(v)
		if err != nil || len(v) > 64 || strings.Contains(v, "..") || strings.HasPrefix(v, "/") || strings.EqualFold(v, "local") {
			p.Add("tz", "must be an IANA time zone, for example Europe/Paris or America/New_York")
		} else {
			u.zone = loc
		}
	}
	seen := map[string]bool{}
	add := func(field, name string) {
		if !ledger.IsUsageGroup(name) {
			p.Add(field, fmt.Sprintf("unknown group %q (%s)", name, strings.Join(ledger.UsageGroups, ", ")))
			return
		}
		if !seen[name] {
			u.dims, seen[name] = append(u.dims, name), true
		}
	}
	if g := q.Get("group_by"); g != "" {
		for _, name := range strings.Split(g, ",") {
			add("group_by", strings.TrimSpace(name))
		}
	}
	if w := q.Get("window"); w != "" {
		switch w {
		case "hour", "day", "month":
			for _, d := range u.dims {
				if d != w && (d == "hour" || d == "day" || d == "month") {
					p.Add("window", fmt.Sprintf("is %s, but group_by already buckets by %s", w, d))
				}
			}
			add("window", w)
		default:
			p.Add("window", "must be hour, day or month")
		}
	}
	// the instants given for from, to and as_of, in the order, "" for a default
	var given [3]string
	y, m, d := now.In(u.zone).Date()
	today := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // a calendar day; its start in tz is dayStart's
	u.from, u.to = dayStart(today.AddDate(0, 0, -30), u.zone), dayStart(today.AddDate(0, 0, 1), u.zone)
	u.fromText, u.toText = today.AddDate(0, 0, -30).Format(time.DateOnly), today.Format(time.DateOnly)
	for i, b := range []struct {
		name string
		end  bool // to: a date includes its whole day
		dst  *time.Time
		text *string
	}{{"from", false, &u.from, &u.fromText}, {"to", true, &u.to, &u.toText}} {
		v := q.Get(b.name)
		if v == "" {
			continue
		}
		if d, err := time.Parse(time.DateOnly, v); err == nil && d.Year() >= 1 {
			*b.dst, *b.text = dayStart(d, u.zone), v
			if b.end {
				*b.dst = dayStart(d.AddDate(0, 0, 1), u.zone)
			}
		} else if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.Year() >= 1 {
			*b.dst, *b.text = t, v
		} else {
			p.Add(b.name, "must be a date YYYY-MM-DD (in tz) or an RFC 3339 time, from year 1")
		}
		given[i] = b.dst.UTC().Format(time.RFC3339Nano)
	}
	if v := q.Get("as_of"); v != "" {
		// The account as it stood then: charges charged before as_of. A charge commits
		// within 30 s of its charged_at or never (asOfMargin), so past the margin no
		// charge can still arrive and the answer never changes again.
		t, err := time.Parse(time.RFC3339Nano, v)
		switch {
		case err != nil:
			p.Add("as_of", "must be an RFC 3339 time")
		case t.After(now.Add(-asOfMargin)):
			p.Add("as_of", fmt.Sprintf("must be at least %v ago (later charges may still be committing)", asOfMargin))
		default:
			u.asOf, given[2] = t, t.UTC().Format(time.RFC3339Nano)
			if u.to.After(t) {
				u.to = t
			}
		}
	}
	if !u.to.After(u.from) {
		p.Add("to", "must be after from (and before as_of)")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > usagePageMax {
			p.Add("limit", fmt.Sprintf("must be from 1 to %d", usagePageMax))
		} else {
			u.limit = n
		}
	}
	// the env asked for (checked against the key by the handler) is the query's too
	u.scope = usageScope(u.dims, u.zone, given, q.Get("env"))
	if v := q.Get("cursor"); v != "" {
		after, ok := decodeUsageCursor(v, u.scope, len(u.dims))
		if !ok {
			p.Add("cursor", "is not a cursor of this query (take next_cursor from the previous page, with the same group_by, window, tz, from, to and as_of)")
		}
		u.after = after
	}
	return u, p.Err()
}

// usageScope names what a page's groups are, and in which order: the grouping columns
// in order, the zone that labels the time buckets, and the from, to and as_of given
// (as instants: equal spellings agree; a default range is not bound, so paging on
// across midnight goes on, like paging while charges arrive). A cursor carries it:
// its values only mean something against the same columns (a cursor of group_by=key
// read as endpoints skipped every endpoint, silently).
func usageScope(dims []string, zone *time.Location, given [3]string, env string) string {
	h := sha256.Sum256([]byte(strings.Join(dims, ",") + "\n" + zone.String() + "\n" + strings.Join(given[:], "\n") + "\n" + env))
	return base64.RawURLEncoding.EncodeToString(h[:9])
}

// usageCursor is a /usage cursor: the last group's values and the scope of the query
// that listed it. Opaque to clients.
type usageCursor struct {
	Scope string   `json:"scope"`
	After []string `json:"after"`
}

func encodeUsageCursor(scope string, values []string) string {
	b, _ := json.Marshal(usageCursor{Scope: scope, After: values}) //nolint:errchkjson // strings always marshal
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeUsageCursor reads a cursor of the query of scope with groups columns: one
// encodeUsageCursor made (one spelling each), with a short text per value.
func decodeUsageCursor(s, scope string, groups int) ([]string, bool) {
	if len(s) > 4096 || groups == 0 {
		return nil, false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, false
	}
	var c usageCursor
	if json.Unmarshal(b, &c) != nil || c.Scope != scope || len(c.After) != groups {
		return nil, false
	}
	for _, v := range c.After {
		if len(v) > 256 || domain.TextProblem(v, false) != "" {
			return nil, false
		}
	}
	if encodeUsageCursor(scope, c.After) != s {
		return nil, false
	}
	return c.After, true
}

// usage answers GET /usage from the charges read model: JSON, or CSV when asked.
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	// the calling key's book, or env's: a live key may ask for the test book, a test
	// key sees only its own (decisions.md: test usage is never live usage)
	le := listEnvOf(key)
	var envProblems domain.Problems
	if vs, ok := r.URL.Query()["env"]; ok {
		le.read(&envProblems, "env", vs[0])
	}
	u, err := parseUsage(r.URL.Query(), time.Now())
	if err == nil {
		err = envProblems.Err()
	} else {
		err = withProblems(err, envProblems)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	env, err := le.show("usage")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rep, err := ledger.Usage(r.Context(), s.pool, ledger.UsageQuery{AccountID: key.AccountID(), Env: env.String(),
		From: u.from, To: u.to, Zone: u.zone.String(), GroupBy: u.dims, Limit: u.limit, After: u.after})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var next string
	if rep.More {
		next = encodeUsageCursor(u.scope, rep.Groups[len(rep.Groups)-1].Values)
	}
	w.Header().Set("Vary", "Accept")
	w.Header().Set("Cache-Control", "no-store")
	if wantsCSV(acceptOf(r)) {
		s.writeUsageCSV(w, r, u.dims, rep, next)
		return
	}
	groups := []map[string]any{}
	for _, g := range rep.Groups {
		m := usageSums(g.Calls, g.Units, g.USD, g.UsageCredits)
		for i, d := range u.dims {
			m[d] = g.Values[i]
		}
		groups = append(groups, m)
	}
	if u.dims == nil {
		u.dims = []string{}
	}
	body := map[string]any{
		"from": u.fromText, "to": u.toText, "tz": u.zone.String(), "group_by": u.dims,
		"groups": groups, "totals": usageSums(rep.Calls, rep.Units, rep.USD, rep.UsageCredits),
		"next_cursor": nil,
	}
	if !u.asOf.IsZero() {
		body["as_of"] = u.asOf.UTC().Format(time.RFC3339Nano)
	}
	if next != "" {
		body["next_cursor"] = next
	}
	writeJSON(w, http.StatusOK, body)
}

// usageSums renders what was charged, credited back, and the net.
func usageSums(calls, units int64, charged decimal.Decimal, c ledger.UsageCredits) map[string]any {
	return map[string]any{"calls": calls, "units": units, "usd": usd(charged),
		"credits": c.Credits, "credited_units": c.CreditedUnits, "credited_usd": usd(c.CreditedUSD),
		"net_units": units - c.CreditedUnits, "net_usd": usd(charged.Sub(c.CreditedUSD))}
}

// setTotals puts a CSV answer's totals in headers named prefix + Calls, Units, USD,
// Credits, Credited-Units and Credited-USD (the CSV body has no room for them).
func setTotals(h http.Header, prefix string, calls, units int64, charged decimal.Decimal, c ledger.UsageCredits) {
	h.Set(prefix+"Calls", strconv.FormatInt(calls, 10))
	h.Set(prefix+"Units", strconv.FormatInt(units, 10))
	h.Set(prefix+"USD", usd(charged))
	h.Set(prefix+"Credits", strconv.FormatInt(c.Credits, 10))
	h.Set(prefix+"Credited-Units", strconv.FormatInt(c.CreditedUnits, 10))
	h.Set(prefix+"Credited-USD", usd(c.CreditedUSD))
}

// writeUsageCSV writes a page of groups as CSV: a header row of the groups and the
// sums, then one row per group, as the JSON lists them; without groups, one row of the
// totals, which are also in Usage-Total-* headers. The next page is in Link.
func (s *Server) writeUsageCSV(w http.ResponseWriter, r *http.Request, dims []string, rep ledger.UsageReport, next string) {
	h := w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	if next != "" {
		q := r.URL.Query()
		q.Set("cursor", next)
		h.Set("Link", fmt.Sprintf(`<%s/usage?%s>; rel="next"`, s.baseURL, q.Encode()))
	}
	setTotals(h, "Usage-Total-", rep.Calls, rep.Units, rep.USD, rep.UsageCredits)
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	cw.Write(append(slices.Clone(dims), "calls", "units", "usd", "credits", "credited_units", "credited_usd", "net_units", "net_usd")) //nolint:errcheck // a failed write shows in Flush
	row := func(values []string, calls, units int64, charged decimal.Decimal, c ledger.UsageCredits) {
		cw.Write(append(csvCells(values), strconv.FormatInt(calls, 10), strconv.FormatInt(units, 10), usd(charged), //nolint:errcheck // as above
			strconv.FormatInt(c.Credits, 10), strconv.FormatInt(c.CreditedUnits, 10), usd(c.CreditedUSD),
			strconv.FormatInt(units-c.CreditedUnits, 10), usd(charged.Sub(c.CreditedUSD))))
	}
	if len(dims) == 0 {
		row(nil, rep.Calls, rep.Units, rep.USD, rep.UsageCredits)
	}
	for _, g := range rep.Groups {
		row(g.Values, g.Calls, g.Units, g.USD, g.UsageCredits)
	}
	cw.Flush()
}
