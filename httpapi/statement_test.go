package httpapi_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/postgres/pgtest"
)

// stmtPage is one page of GET /usage/charges as JSON.
type stmtPage struct {
	rows   []map[string]any
	next   string // "" at the end
	calls  int64
	units  int64
	usd    string
	header http.Header
}

// stmtJSON reads one page of the statement.
func (e *env) stmtJSON(key, query string) stmtPage {
	e.t.Helper()
	r := e.do("GET", "/v1/usage/charges?"+query, key, nil)
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/json" {
		e.t.Fatalf("statement %q: %d %s", query, r.Status, r.Raw)
	}
	p := stmtPage{calls: int64(r.Body["total_calls"].(float64)), units: int64(r.Body["total_units"].(float64)),
		usd: r.Body["total_usd"].(string), header: r.Header}
	for _, row := range r.Body["charges"].([]any) {
		p.rows = append(p.rows, row.(map[string]any))
	}
	if n, ok := r.Body["next_cursor"].(string); ok {
		p.next = n
	} else if r.Body["next_cursor"] != nil {
		e.t.Fatalf("next_cursor %v", r.Body["next_cursor"])
	}
	return p
}

// stmtAllJSON pages through the statement with query (limit included), checking on the
// way that every page carries the same totals and that its Link matches next_cursor.
func (e *env) stmtAllJSON(key, query string) (rows []map[string]any, last stmtPage) {
	e.t.Helper()
	q := query
	for {
		p := e.stmtJSON(key, q)
		if len(rows) > 0 && (p.calls != last.calls || p.units != last.units || p.usd != last.usd) {
			e.t.Fatalf("totals changed between pages with no new charges: %+v then %+v", last, p)
		}
		rows, last = append(rows, p.rows...), p
		link := p.header.Get("Link")
		if p.next == "" {
			if link != "" {
				e.t.Fatalf("last page has a Link: %s", link)
			}
			return rows, last
		}
		if !strings.Contains(link, "cursor="+p.next) || !strings.HasSuffix(link, `>; rel="next"`) {
			e.t.Fatalf("Link %q does not continue at %s", link, p.next)
		}
		v, _ := url.ParseQuery(query)
		v.Set("cursor", p.next)
		q = v.Encode()
	}
}

// stmtAllCSV pages through the statement as CSV, following the Link header; it returns
// the header row and the rows.
func (e *env) stmtAllCSV(key, query string) (header []string, rows [][]string) {
	e.t.Helper()
	next := e.srv.URL + "/v1/usage/charges?" + query
	for next != "" {
		req, _ := http.NewRequest("GET", next, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Accept", "text/csv")
		res, err := e.srv.Client().Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/csv") {
			e.t.Fatalf("CSV statement: %d %s %s", res.StatusCode, res.Header.Get("Content-Type"), raw)
		}
		recs, err := csv.NewReader(strings.NewReader(string(raw))).ReadAll()
		if err != nil || len(recs) == 0 {
			e.t.Fatalf("CSV statement: %v: %q", err, raw)
		}
		if header != nil && strings.Join(header, ",") != strings.Join(recs[0], ",") {
			e.t.Fatalf("CSV header changed between pages: %v then %v", header, recs[0])
		}
		header, rows = recs[0], append(rows, recs[1:]...)
		next = ""
		if link := res.Header.Get("Link"); link != "" {
			u, ok := strings.CutPrefix(link, "<http://chessd.test")
			if !ok || !strings.HasSuffix(u, `>; rel="next"`) {
				e.t.Fatalf("Link %q", link)
			}
			next = e.srv.URL + strings.TrimSuffix(u, `>; rel="next"`)
		}
	}
	return header, rows
}

// cell is a JSON value as the statement's CSV writes it.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	case string:
		return v
	}
	return fmt.Sprintf("unexpected %T", v)
}

// sumRows adds the rows' units and USD.
func sumRows(t *testing.T, rows []map[string]any) (int64, string) {
	t.Helper()
	units, usd := int64(0), decimal.Zero
	for _, r := range rows {
		units += int64(r["units"].(float64))
		usd = usd.Add(decimal.RequireFromString(r["usd"].(string)))
	}
	return units, usd.StringFixed(6)
}

// The statement, filtered every way, in pages: its totals equal the rows' sums and
// GET /usage's totals for the same charges to the unit and the cent, and its CSV has
// the same rows as its JSON, cell by cell.
func TestStatementTotalsEqualUsageAndCSVEqualsJSON(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("statement@example.com")
	liveID := principalKeyID(t, e, live)
	test, testID := e.createKey(live, map[string]any{"env": "test", "label": "t"})
	second, secondID := e.createKey(live, map[string]any{"label": "second", "scopes": []string{"eval", "usage:read"}})
	mixedLoad(t, e, live, test)
	if r := e.do("POST", "/v1/eval", second, evalBody(startFEN, `"depth":9`)); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	e.caughtUp()
	split := time.Now().UTC() // charges after this: the batch job's positions only
	r := e.do("POST", "/v1/batch", live, map[string]any{"fens": jobFENs(3), "depth": 6})
	if r.Status != 202 {
		t.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	if job := e.waitJob(live, r.Body["job_id"].(string), finished); job["state"] != "succeeded" {
		t.Fatalf("job %v", job)
	}
	e.caughtUp()

	type group struct {
		env, key, endpoint string
		calls, units       int64
		usd                decimal.Decimal
	}
	var groups []group
	for _, book := range []string{"", "&env=test"} { // the live key's book, then the test one
		u := e.do("GET", "/v1/usage?group_by=env,key,endpoint"+book, live, nil)
		for _, g := range u.Body["groups"].([]any) {
			g := g.(map[string]any)
			groups = append(groups, group{g["env"].(string), g["key"].(string), g["endpoint"].(string),
				int64(g["calls"].(float64)), int64(g["units"].(float64)), decimal.RequireFromString(g["usd"].(string))})
		}
	}
	cases := []struct {
		name, key, env, keyID, endpoint, query string
		wantCalls                              int64 // 0: whatever /usage says, at least one
	}{
		{"live", live, "live", "", "", "", 0},
		{"live, first key", live, "live", liveID, "", "key_id=" + liveID, 0},
		{"live, second key (seen by it)", second, "live", secondID, "", "key_id=" + secondID, 1},
		{"live, eval", live, "live", "", "eval", "endpoint=eval", 0},
		{"live, bestmove", live, "live", "", "bestmove", "endpoint=bestmove", 0},
		{"live, batch", live, "live", "", "batch", "endpoint=batch", 3},
		{"live, first key's evals", live, "live", liveID, "eval", "endpoint=eval&key_id=" + liveID, 0},
		{"live, today by date", live, "live", "", "", "from=" + split.Format(time.DateOnly) + "&to=" + split.Format(time.DateOnly), 0},
		{"test", test, "test", "", "", "", 0},
		{"test, its key", test, "test", testID, "", "key_id=" + testID, 0},
		{"test, another key's id", test, "test", liveID, "", "key_id=" + liveID, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want group
			for _, g := range groups {
				if g.env == tc.env && (tc.keyID == "" || g.key == tc.keyID) && (tc.endpoint == "" || g.endpoint == tc.endpoint) {
					want.calls, want.units, want.usd = want.calls+g.calls, want.units+g.units, want.usd.Add(g.usd)
				}
			}
			if tc.wantCalls > 0 && want.calls != tc.wantCalls || tc.wantCalls == 0 && want.calls == 0 || tc.wantCalls < 0 && want.calls != 0 {
				t.Fatalf("usage has %d calls for this filter, the test wants %d", want.calls, tc.wantCalls)
			}
			query := "limit=2"
			if tc.query != "" {
				query += "&" + tc.query
			}
			rows, last := e.stmtAllJSON(tc.key, query)
			units, usd := sumRows(t, rows)
			if int64(len(rows)) != want.calls || last.calls != want.calls || last.units != units || last.usd != usd ||
				units != want.units || usd != want.usd.StringFixed(6) {
				t.Fatalf("statement: %d rows of %d units $%s, totals %d calls %d units $%s; /usage: %d calls %d units $%s",
					len(rows), units, usd, last.calls, last.units, last.usd, want.calls, want.units, want.usd.StringFixed(6))
			}
			for _, row := range rows {
				if row["env"] != tc.env || tc.keyID != "" && row["key_id"] != tc.keyID || tc.endpoint != "" && row["endpoint"] != tc.endpoint {
					t.Fatalf("a row outside the filter: %v", row)
				}
			}
			header, recs := e.stmtAllCSV(tc.key, query)
			if len(recs) != len(rows) {
				t.Fatalf("CSV has %d rows, JSON %d", len(recs), len(rows))
			}
			for i, rec := range recs {
				if len(rec) != len(header) || len(rows[i]) != len(header) {
					t.Fatalf("row %d: %d CSV cells, %d JSON fields, %d columns", i, len(rec), len(rows[i]), len(header))
				}
				for j, col := range header {
					v, ok := rows[i][col]
					if !ok || cell(v) != rec[j] {
						t.Fatalf("row %d column %s: CSV %q, JSON %v", i, col, rec[j], v)
					}
				}
			}
		})
	}
	// test keys: the statement is /usage itself, which shows a test key its book only
	tu := e.do("GET", "/v1/usage", test, nil).Body["totals"].(map[string]any)
	if p := e.stmtJSON(test, ""); float64(p.calls) != tu["calls"] || float64(p.units) != tu["units"] || p.usd != tu["usd"] {
		t.Fatalf("test key: statement %d calls %d units $%s, /usage %v", p.calls, p.units, p.usd, tu)
	}
	// times bound charged_at: from is inclusive, to exclusive
	at := url.QueryEscape(split.Format(time.RFC3339Nano))
	after, before := e.stmtJSON(live, "from="+at), e.stmtJSON(live, "to="+at)
	all := e.stmtJSON(live, "")
	if len(after.rows) != 3 || after.calls+before.calls != all.calls || after.units+before.units != all.units {
		t.Fatalf("split at %s: %d + %d calls, the whole %d", split, after.calls, before.calls, all.calls)
	}
	for _, row := range after.rows {
		if row["endpoint"] != "batch" || row["job_id"] == nil || row["positions"] != float64(1) {
			t.Fatalf("after the split: %v", row)
		}
	}
}

// Paging with the cursor while new charges keep arriving returns every charge exactly
// once, in the order they were committed, including the ones that arrived meanwhile.
func TestStatementPagingWhileChargesArrive(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("paging@example.com")
	for i := range 5 {
		if r := e.do("POST", "/v1/eval", key, evalBody(jobFENs(5)[i], `"depth":6`)); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	e.caughtUp()
	ctx := context.Background()
	count := func() int64 {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM charge_lines()`).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	// the first five settled (a group commit may still hold the last): else the wait
	// below could take a late one of them for a charge that arrived meanwhile
	pgtest.WaitFor(t, "the first charges", func() bool { return count() == 5 })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // cached calls after the first: a steady stream of new charges
		defer wg.Done()
		for i := range 30 {
			path := "/v1/eval"
			if i%2 == 1 {
				path = "/v1/bestmove"
			}
			r, err := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(evalBody(cheapFEN, `"depth":6`)))
			if err != nil {
				t.Error(err)
				return
			}
			r.Header.Set("Authorization", "Bearer "+key)
			res, err := e.srv.Client().Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, res.Body) //nolint:errcheck
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Errorf("%s: %d", path, res.StatusCode)
				return
			}
		}
	}()
	var seen []string
	query := "limit=3"
	for page := 0; ; page++ {
		p := e.stmtJSON(key, query)
		for _, row := range p.rows {
			seen = append(seen, row["charge_id"].(string))
		}
		if p.next == "" {
			break
		}
		// let at least one new charge land before the next page (the calls may all have
		// been answered before any of theirs settled: their charges land all the same)
		pgtest.WaitFor(t, "a new charge", func() bool { n := count(); return n > p.calls || n == 35 })
		query = "limit=3&cursor=" + p.next
	}
	wg.Wait()
	e.caughtUp()
	all := e.stmtJSON(key, "limit=1000")
	if all.next != "" || all.calls != 35 || len(all.rows) != 35 {
		t.Fatalf("the whole statement: %d rows, %d calls, next %q; want 35", len(all.rows), all.calls, all.next)
	}
	if len(seen) <= 5 {
		t.Fatalf("paging saw %d charges: none of those that arrived meanwhile", len(seen))
	}
	once := map[string]bool{}
	for i, id := range seen {
		if once[id] {
			t.Fatalf("charge %s paged twice", id)
		}
		once[id] = true
		if all.rows[i]["charge_id"] != id {
			t.Fatalf("page order: %d-th paged charge is %s, the statement has %s there (a charge was skipped)", i, id, all.rows[i]["charge_id"])
		}
	}
	var prev ledger.Cursor
	for _, row := range all.rows {
		c := ledger.Cursor{Position: int64(row["event_position"].(float64))}
		if pos, line, ok := ledger.ParseLineChargeID(row["charge_id"].(string)); ok {
			if pos != c.Position {
				t.Fatalf("charge %v is not of the event at %d", row["charge_id"], c.Position)
			}
			c.Line = line
		}
		if c.Position < prev.Position || (c.Position == prev.Position && c.Line <= prev.Line) {
			t.Fatalf("charges not in the log's order: %+v after %+v", c, prev)
		}
		prev = c
	}
}

// GET /charges/{id} explains every charge: the event that recorded it, the request's
// other events, the price from the table (which matches), the key's spend before and
// after and its budget as it stood then, the account's day around it.
func TestChargeExplanation(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("explain@example.com")
	key, keyID := e.createKey(owner, map[string]any{"label": "budgeted", "budget_units": 5000, "budget_usd": "0.05",
		"scopes": []string{"eval", "jobs", "usage:read"}})
	for _, extra := range []string{`"depth":12,"multipv":2`, `"depth":12,"multipv":2`, `"depth":20,"movetime_ms":100`} {
		if r := e.do("POST", "/v1/eval", key, evalBody(cheapFEN, extra)); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/batch", strings.NewReader(`{"fens":["`+startFEN+`","`+jobFENs(2)[1]+`"],"depth":6}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Request-Id", "req-explain-batch")
	r := e.send(req)
	if r.Status != 202 {
		t.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	jobID := r.Body["job_id"].(string)
	e.waitJob(key, jobID, finished)
	e.caughtUp()
	// the budget changes after the charges: each explanation shows the one it was charged under
	if r := e.do("PATCH", "/v1/keys/"+keyID, owner, map[string]any{"budget_units": 9000}); r.Status != 200 {
		t.Fatal(r.Raw)
	}
	rows, _ := e.stmtAllJSON(key, "key_id="+keyID)
	if len(rows) != 5 {
		t.Fatalf("%d charges, want 5", len(rows))
	}
	var spent, dayUnits float64
	for i, row := range rows {
		id := row["charge_id"].(string)
		x := e.do("GET", "/v1/charges/"+id, key, nil)
		if x.Status != 200 {
			t.Fatalf("%s: %d %s", id, x.Status, x.Raw)
		}
		if fmt.Sprint(x.Body["charge"]) != fmt.Sprint(row) {
			t.Fatalf("charge %d: explained as %v, the statement has %v", i, x.Body["charge"], row)
		}
		ev := x.Body["event"].(map[string]any)
		// a call's charge is a line of its group commit's ChargesSettled, a job position's its own UnitsCharged
		settled := ev["type"] == "ChargesSettled" && ev["line"] != nil && row["job_id"] == nil
		job := ev["type"] == "UnitsCharged" && ev["line"] == nil && row["job_id"] != nil
		if ev["position"] != row["event_position"] || !(settled || job) || ev["stream_id"] != "ledger-"+keyID ||
			ev["hash_matches"] != true || len(ev["hash"].(string)) != 64 {
			t.Fatalf("charge %d: event %v", i, ev)
		}
		price := x.Body["price"].(map[string]any)
		if x.Body["price_check"] != "matches" || price["units"] != row["units"] || price["usd"] != row["usd"] ||
			price["cached"] != row["cached"] || x.Body["balanced"] != true || len(x.Body["postings"].([]any)) != 4 {
			t.Fatalf("charge %d: price %v, check %v, postings %v", i, price, x.Body["price_check"], x.Body["postings"])
		}
		// the quote link gives the same price
		quote, _ := strings.CutPrefix(price["quote"].(string), "http://chessd.test")
		q := e.do("GET", quote, key, nil)
		perPos := "units_per_position"
		if row["cached"] == true {
			perPos = "cached_units_per_position"
		}
		if q.Status != 200 || q.Body["breakdown"].(map[string]any)[perPos] != price[perPos] {
			t.Fatalf("charge %d: %s quotes %s, the explanation %v", i, quote, q.Raw, price)
		}
		k := x.Body["key"].(map[string]any)
		units := row["units"].(float64)
		if k["spent_units_before"] != spent || k["spent_units_after"] != spent+units || k["budget_units"] != float64(5000) ||
			k["remaining_units_after"] != 5000-spent-units || k["budget_usd"] != "0.050000" {
			t.Fatalf("charge %d: key %v, want spent %v → %v under the budget of then (5000)", i, k, spent, spent+units)
		}
		a := x.Body["account"].(map[string]any)
		if a["units_before"] != dayUnits || a["units_after"] != dayUnits+units || a["plan"] != "pro" || a["allowance_units"] != float64(2_000_000) {
			t.Fatalf("charge %d: account %v", i, a)
		}
		spent, dayUnits = spent+units, dayUnits+units
		related := x.Body["related_events"].([]any)
		if row["job_id"] == nil {
			if len(related) != 0 {
				t.Fatalf("charge %d: a single call with related events %v", i, related)
			}
			continue
		}
		// a job's position: the submission (with the request's id) ... the position's record
		first, last := related[0].(map[string]any), related[len(related)-1].(map[string]any)
		if first["type"] != "JobSubmitted" || first["request_id"] != "req-explain-batch" ||
			last["type"] != "JobPositionAnalysed" || last["causation_id"] != id || last["stream_id"] != "job-"+jobID {
			t.Fatalf("charge %d: related events %v", i, related)
		}
	}
	if rows[1]["cached"] != true || rows[2]["movetime_ms"] != float64(100) {
		t.Fatalf("the calls were not what the test meant: %v", rows)
	}
}

// A charge is explained only to its own account and env: another account's, or one of
// the other env, is 404 exactly like an unknown id; and the statement of each shows
// only its own.
func TestChargeIsolation(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("isolated@example.com")
	test, _ := e.createKey(live, map[string]any{"env": "test", "label": "t"})
	other, _ := e.signup("other@example.com")
	// one client-chosen request id for the live key's key creation and both keys' calls:
	// a charge's related events are its own key's, never the other env's
	sameID := func(method, path, key, body string) response {
		req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Request-Id", "deploy-42")
		return e.send(req)
	}
	if r := sameID("POST", "/v1/keys", live, `{"label":"made under a reused request id"}`); r.Status != 201 {
		t.Fatal(r.Raw)
	}
	for _, k := range []string{live, test} {
		if r := sameID("POST", "/v1/eval", k, evalBody(cheapFEN, `"depth":6`)); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	e.caughtUp()
	liveCharge := e.stmtJSON(live, "").rows[0]["charge_id"].(string)
	testCharge := e.stmtJSON(test, "").rows[0]["charge_id"].(string)
	if x := e.do("GET", "/v1/charges/"+testCharge, test, nil); x.Status != 200 || len(x.Body["related_events"].([]any)) != 0 {
		t.Fatalf("the test key's charge shows related events: %d %s", x.Status, x.Raw)
	}
	cases := []struct {
		name, key, id string
		status        int
	}{
		{"own live", live, liveCharge, 200},
		{"own test", test, testCharge, 200},
		{"test key, live charge", test, liveCharge, 404},
		{"live key, test charge", live, testCharge, 404},
		{"another account", other, liveCharge, 404},
		{"unknown", live, "chg_000000000000000000000000", 404},
		{"not an id", live, "position-1", 404},
	}
	var notFound string
	for _, tc := range cases {
		r := e.do("GET", "/v1/charges/"+tc.id, tc.key, nil)
		if tc.status == 200 {
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", tc.name, r.Status, r.Raw)
			}
			continue
		}
		wantProblem(t, r, 404, "fix_request")
		// the same answer whether the charge exists elsewhere or not at all
		detail := strings.ReplaceAll(r.Body["detail"].(string), tc.id, "ID")
		if notFound != "" && detail != notFound {
			t.Fatalf("%s: %q, another 404 said %q", tc.name, detail, notFound)
		}
		notFound = detail
	}
	for _, v := range []struct{ key, env string }{{live, "live"}, {test, "test"}} {
		p := e.stmtJSON(v.key, "")
		if len(p.rows) != 1 || p.rows[0]["env"] != v.env || p.calls != 1 {
			t.Fatalf("%s key's statement: %v", v.env, p.rows)
		}
	}
	if p := e.stmtJSON(other, ""); len(p.rows) != 0 || p.calls != 0 || p.usd != "0.000000" {
		t.Fatalf("another account's statement shows %v", p.rows)
	}
}

// Bad input is a 400 problem naming each field; Accept chooses CSV or JSON; the
// endpoints need a key with usage:read.
func TestStatementRequests(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("requests@example.com")
	evalOnly, _ := e.createKey(key, map[string]any{"scopes": []string{"eval"}})
	bad := []struct {
		query  string
		fields []string
	}{
		{"cursor=garbage", []string{"cursor"}},
		{"cursor=AAAAAAAAAAA", []string{"cursor"}},
		{"cursor=AAAAAAAAAAE%3D", []string{"cursor"}},
		{"limit=0", []string{"limit"}},
		{"limit=1001", []string{"limit"}},
		{"limit=ten", []string{"limit"}},
		{"endpoint=price", []string{"endpoint"}},
		{"key_id=someone", []string{"key_id"}},
		{"from=yesterday", []string{"from"}},
		{"from=2026-11-10&to=2026-11-01", []string{"to"}},
		// the day before from: its end is from's start, and was let through (200, empty)
		{"from=2026-12-07&to=2026-12-06", []string{"to"}},
		{"from=2026-12-07T00:00:00Z&to=2026-12-06", []string{"to"}},
		{"from=2026-11-10T12:00:00Z&to=2026-11-10T11:00:00Z", []string{"to"}},
		{"to=2026-13-01", []string{"to"}},
		{"from=0000-01-01", []string{"from"}}, // Go reads year 0, PostgreSQL does not: it was a 500
		{"limit=5&limit=6", []string{"limit"}},
		{"page=2", []string{"page"}},
		{"limit=0&cursor=x&endpoint=y", []string{"endpoint", "limit", "cursor"}},
	}
	for _, tc := range bad {
		r := e.do("GET", "/v1/usage/charges?"+tc.query, key, nil)
		wantProblem(t, r, 400, "fix_request")
		var fields []string
		for _, f := range r.Body["errors"].([]any) {
			fields = append(fields, f.(map[string]any)["field"].(string))
		}
		if strings.Join(fields, ",") != strings.Join(tc.fields, ",") {
			t.Errorf("%s: fields %v, want %v", tc.query, fields, tc.fields)
		}
	}
	// one day, and an empty half-open range, are ranges
	for _, q := range []string{"from=2026-12-07&to=2026-12-07", "from=2026-12-07&to=2026-12-07T00:00:00Z",
		"from=2026-12-07T10:00:00Z&to=2026-12-07T10:00:00Z"} {
		if r := e.do("GET", "/v1/usage/charges?"+q, key, nil); r.Status != 200 {
			t.Errorf("%s: %d %s", q, r.Status, r.Raw)
		}
	}
	wantProblem(t, e.do("GET", "/v1/charges/chg_x?verbose=1", key, nil), 400, "fix_request")
	// a zone Go knows and PostgreSQL refuses (leap seconds) names tz; it was a 500
	if r := e.do("GET", "/v1/usage?tz=right/UTC&group_by=day", key, nil); r.Status != 400 || !strings.Contains(r.Raw, `"field":"tz"`) {
		t.Errorf("GET /usage?tz=right/UTC: %d %s", r.Status, r.Raw)
	}
	wantProblem(t, e.do("GET", "/v1/usage/charges", "", nil), 401, "sign_up")
	wantProblem(t, e.do("GET", "/v1/usage/charges", evalOnly, nil), 403, "fix_request")
	wantProblem(t, e.do("GET", "/v1/charges/chg_x", evalOnly, nil), 403, "fix_request")
	wantProblem(t, e.do("POST", "/v1/usage/charges", key, nil), 405, "fix_request")

	accepts := []struct {
		accept string
		csv    bool
	}{
		{"", false},
		{"*/*", false},
		{"application/json", false},
		{"text/csv", true},
		{"text/csv; charset=utf-8", true},
		{"text/*", true},
		{"application/json;q=0.5, text/csv", true},
		{"text/csv;q=0.5, application/json", false},
		{"text/csv, application/json", false}, // a tie: JSON
		{"text/csv;q=0", false},
		{"image/png", false},
	}
	for _, tc := range accepts {
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/usage/charges", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		res, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		ct := res.Header.Get("Content-Type")
		if res.StatusCode != 200 || strings.HasPrefix(ct, "text/csv") != tc.csv || res.Header.Get("Vary") != "Accept" {
			t.Errorf("Accept %q: %d %s %q", tc.accept, res.StatusCode, ct, raw)
		}
		if tc.csv && !strings.HasPrefix(string(raw), "charge_id,charged_at,") {
			t.Errorf("Accept %q: CSV without its header row: %q", tc.accept, raw)
		}
	}
}

// The statement's CSV never hands a spreadsheet a formula: a request id the client
// chose that a spreadsheet would read as one is written as text, and the JSON keeps it
// as it is.
func TestStatementCSVHoldsNoFormula(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("csv-formula@example.com")
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/eval", strings.NewReader(evalBody(cheapFEN, `"depth":6`)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "-A1")
	if r := e.send(req); r.Status != 200 {
		t.Fatalf("eval: %d %s", r.Status, r.Raw)
	}
	e.caughtUp()
	rows, _ := e.stmtAllJSON(key, "")
	header, recs := e.stmtAllCSV(key, "")
	col := slices.Index(header, "request_id")
	if len(rows) != 1 || len(recs) != 1 || col < 0 {
		t.Fatalf("%d JSON rows, %d CSV rows, request_id column %d", len(rows), len(recs), col)
	}
	if rows[0]["request_id"] != "-A1" || recs[0][col] != "'-A1" {
		t.Fatalf("request id: JSON %v, CSV %q; want -A1 and '-A1", rows[0]["request_id"], recs[0][col])
	}
}

// An explanation counts the spend as the meter did: net of the credits given back
// before the charge. A key with room for two calls spends it, one call is refunded, and
// a third fits; its explanation shows the budget full, not crossed, as /me does.
func TestExplanationCountsCreditsBefore(t *testing.T) {
	e := newEnv(t)
	owner := e.signupPro("credited-before@example.com")
	price, err := ledger.Quote(domain.Call{Endpoint: domain.EndpointEval, Depth: 6, MultiPV: 1, Positions: 1})
	if err != nil {
		t.Fatal(err)
	}
	key, keyID := e.createKey(owner, map[string]any{"label": "two calls", "scopes": []string{"eval", "usage:read"}, "budget_units": 2 * price.Units})
	fens := []string{startFEN, cheapFEN, "4k3/8/8/8/8/8/4P3/4K3 w - - 0 1"}
	for _, fen := range fens[:2] {
		if r := e.do("POST", "/v1/eval", key, evalBody(fen, `"depth":6`)); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	wantProblem(t, e.do("POST", "/v1/eval", key, evalBody(fens[2], `"depth":6`)), 402, "raise_budget")
	e.caughtUp()
	first := e.stmtJSON(key, "").rows[0]["charge_id"].(string)
	h := commands.New(eventstore.NewStore(e.pool, nil), nil)
	if _, err := h.RefundCharges(context.Background(), []string{first}, "goodwill", "ops:ana", "r"); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/eval", key, evalBody(fens[2], `"depth":6`)); r.Status != 200 {
		t.Fatalf("a call after the refund: %d %s", r.Status, r.Raw)
	}
	e.caughtUp()
	rows := e.stmtJSON(key, "").rows
	last := rows[len(rows)-1]["charge_id"].(string)
	x := e.do("GET", "/v1/charges/"+last, key, nil)
	if x.Status != 200 {
		t.Fatal(x.Raw)
	}
	k, a := x.Body["key"].(map[string]any), x.Body["account"].(map[string]any)
	u := float64(price.Units)
	if k["key_id"] != keyID || k["spent_units_before"] != u || k["spent_units_after"] != 2*u || k["remaining_units_after"] != float64(0) ||
		a["units_before"] != u || a["units_after"] != 2*u {
		t.Fatalf("explanation after a refund: key %v, account %v; want %v spent before, the budget full after", k, a, u)
	}
	for _, ks := range e.do("GET", "/v1/me", key, nil).Body["key_spend"].([]any) {
		if ks := ks.(map[string]any); ks["key_id"] == keyID && ks["spent_units"] != 2*u {
			t.Fatalf("/me counts %v spent, the explanation %v", ks["spent_units"], k["spent_units_after"])
		}
	}
}
