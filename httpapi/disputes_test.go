package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
)

// A customer disputes charges: one dispute is accepted (its charges credited, shown in
// /usage and the dispute), another rejected with a reason; a charge is disputed once;
// another account's charge, and another account's dispute, are not found. Every step
// is an event on the dispute's stream.
func TestDisputes(t *testing.T) {
	e := newEnv(t)
	live := e.signupPro("disputes@example.com")
	test, _ := e.createKey(live, map[string]any{"env": "test", "label": "t"})
	mixedLoad(t, e, live, test)
	e.caughtUp()
	ctx := context.Background()
	charges := func(env string) []string {
		rows, err := e.pool.Query(ctx, `SELECT charge_id FROM charge_lines() WHERE env = $1 ORDER BY position, line`, env)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	ids, testIDs := charges("live"), charges("test")
	if len(ids) < 4 || len(testIDs) < 1 {
		t.Fatalf("charges: %d live, %d test", len(ids), len(testIDs))
	}
	other := e.signupPro("someone-else@example.com")

	open := func(key string, body map[string]any) response {
		t.Helper()
		return e.do("POST", "/v1/disputes", key, body)
	}
	first := open(live, map[string]any{"charge_ids": []string{ids[0], ids[1]}, "reason": "these ran twice\nsee our logs"})
	if first.Status != 201 || first.Body["state"] != "open" || first.Header.Get("Location") == "" {
		t.Fatalf("open: %d %s", first.Status, first.Raw)
	}
	second := open(live, map[string]any{"charge_ids": []string{ids[2]}, "reason": "too expensive"})
	if second.Status != 201 {
		t.Fatalf("open: %d %s", second.Status, second.Raw)
	}
	wantProblem(t, open(live, map[string]any{"charge_ids": []string{ids[1], ids[3]}, "reason": "again"}), 409, "fix_request")
	wantProblem(t, open(other, map[string]any{"charge_ids": []string{ids[3]}, "reason": "not mine"}), 404, "fix_request")
	wantProblem(t, open(live, map[string]any{"charge_ids": []string{testIDs[0]}, "reason": "a test charge, live key"}), 404, "fix_request")
	wantProblem(t, open(live, map[string]any{"charge_ids": []string{}, "reason": "nothing"}), 400, "fix_request")
	wantProblem(t, open(live, map[string]any{"charge_ids": []string{ids[3]}}), 400, "fix_request")
	firstID, secondID := first.Body["dispute_id"].(string), second.Body["dispute_id"].(string)
	wantProblem(t, e.do("GET", "/v1/disputes/"+firstID, other, nil), 404, "fix_request")
	wantProblem(t, e.do("GET", "/v1/disputes/"+firstID, test, nil), 404, "fix_request")

	// the operator answers (`chessd dispute accept|reject` runs these); a refund of a
	// charge in an open dispute is refused (409): the dispute's answer is to credit it,
	// and a refund first made accepting it impossible
	h := commands.New(eventstore.NewStore(e.pool, nil), nil)
	var de *domain.Error
	if _, err := h.RefundCharges(ctx, []string{ids[3], ids[1]}, "goodwill", "ops:ana", "r"); !errors.As(err, &de) || de.Code != domain.CodeConflict ||
		!strings.Contains(err.Error(), firstID) {
		t.Fatalf("refund of a charge in an open dispute: %v", err)
	}
	if err := h.ResolveDispute(ctx, firstID, true, "ops:ana", "confirmed: a retry storm on our side", "r"); err != nil {
		t.Fatal(err)
	}
	if err := h.ResolveDispute(ctx, secondID, false, "ops:ana", "depth 20 costs what the price table says", "r"); err != nil {
		t.Fatal(err)
	}
	if err := h.ResolveDispute(ctx, firstID, false, "ops:ana", "changed my mind", "r"); err == nil {
		t.Fatal("a resolved dispute was resolved again")
	}
	accepted := e.do("GET", "/v1/disputes/"+firstID, live, nil).Body
	if accepted["state"] != "accepted" || len(accepted["credit_ids"].([]any)) != 2 || accepted["resolution"] != "confirmed: a retry storm on our side" {
		t.Fatalf("accepted: %v", accepted)
	}
	rejected := e.do("GET", "/v1/disputes/"+secondID, live, nil).Body
	if rejected["state"] != "rejected" || len(rejected["credit_ids"].([]any)) != 0 || rejected["resolution"] != "depth 20 costs what the price table says" {
		t.Fatalf("rejected: %v", rejected)
	}
	list := e.do("GET", "/v1/disputes?state=accepted", live, nil)
	if ds := list.Body["disputes"].([]any); list.Status != 200 || len(ds) != 1 || ds[0].(map[string]any)["dispute_id"] != firstID {
		t.Fatalf("accepted disputes: %d %s", list.Status, list.Raw)
	}
	if ds := e.do("GET", "/v1/disputes", test, nil).Body["disputes"].([]any); len(ds) != 0 {
		t.Fatalf("a test key sees live disputes: %v", ds)
	}
	totals := e.do("GET", "/v1/usage", live, nil).Body["totals"].(map[string]any)
	if totals["credits"] != float64(2) || totals["net_units"].(float64) >= totals["units"].(float64) {
		t.Fatalf("usage after the accepted dispute: %v", totals)
	}
	// the statement shows both the charges and their credits
	st := e.do("GET", "/v1/usage/charges?limit=1000", live, nil)
	credited := map[string]bool{}
	for _, c := range st.Body["charges"].([]any) {
		c := c.(map[string]any)
		if c["credit_id"] != nil {
			credited[c["charge_id"].(string)] = true
		}
	}
	var liveNet any
	for _, g := range e.do("GET", "/v1/usage?group_by=env", live, nil).Body["groups"].([]any) {
		if g := g.(map[string]any); g["env"] == "live" {
			liveNet = g["net_units"]
		}
	}
	if st.Status != 200 || len(credited) != 2 || !credited[ids[0]] || !credited[ids[1]] || st.Body["total_credits"] != float64(2) ||
		st.Body["total_net_units"] != liveNet {
		t.Fatalf("statement after the accepted dispute: %d %s", st.Status, st.Raw)
	}
	// the CSV's totals are the JSON's
	_, csvHeader := e.csvAnswer("/v1/usage/charges?limit=1000", live)
	for header, field := range map[string]string{"Calls": "total_calls", "Units": "total_units", "USD": "total_usd",
		"Credits": "total_credits", "Credited-Units": "total_credited_units", "Credited-USD": "total_credited_usd"} {
		if got, want := csvHeader.Get("Statement-Total-"+header), fmt.Sprint(st.Body[field]); got != want {
			t.Errorf("CSV Statement-Total-%s %q, JSON %s %q", header, got, field, want)
		}
	}
	var steps int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id IN ($1, $2)`, "dispute-"+firstID, "dispute-"+secondID).Scan(&steps); err != nil || steps != 4 {
		t.Fatalf("%d dispute events (%v), want open and resolution of each", steps, err)
	}
	var pointed int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM credits WHERE dispute_id = $1 AND charge_id IN ($2, $3)`, firstID, ids[0], ids[1]).Scan(&pointed); err != nil || pointed != 2 {
		t.Fatalf("%d credits point at the dispute (%v)", pointed, err)
	}
	// once its dispute is rejected, a charge may be refunded after all (goodwill)
	if _, err := h.RefundCharges(ctx, []string{ids[2]}, "goodwill after all", "ops:ana", "r"); err != nil {
		t.Fatalf("refund after the dispute's rejection: %v", err)
	}
}

// GET /disputes pages newest first: each page holds at most limit, next_cursor and the
// Link header lead to the next, the pages together hold every dispute once, and a
// cursor the service did not hand out for this list is a 400.
func TestDisputesPaged(t *testing.T) {
	e := newEnv(t)
	key := e.signupPro("disputes-paged@example.com")
	const disputes = 5
	for range disputes {
		if r := e.do("POST", "/v1/eval", key, evalBody(cheapFEN, `"depth":4`)); r.Status != 200 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	}
	e.caughtUp()
	rows, err := e.pool.Query(context.Background(), `SELECT charge_id FROM charge_lines() ORDER BY position, line`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != disputes {
		t.Fatalf("%d charges (%v), want %d", len(ids), err, disputes)
	}
	var opened []string // oldest first
	for _, id := range ids {
		r := e.do("POST", "/v1/disputes", key, map[string]any{"charge_ids": []string{id}, "reason": "paging"})
		if r.Status != 201 {
			t.Fatalf("open: %d %s", r.Status, r.Raw)
		}
		opened = append(opened, r.Body["dispute_id"].(string))
	}
	var listed []string
	path := "/v1/disputes?limit=2"
	for pages := 1; ; pages++ {
		r := e.do("GET", path, key, nil)
		ds := r.Body["disputes"].([]any)
		if r.Status != 200 || len(ds) == 0 || len(ds) > 2 {
			t.Fatalf("page %d: %d %s", pages, r.Status, r.Raw)
		}
		for _, d := range ds {
			listed = append(listed, d.(map[string]any)["dispute_id"].(string))
		}
		next, _ := r.Body["next_cursor"].(string)
		link := r.Header.Get("Link")
		if next == "" {
			if link != "" || pages != 3 {
				t.Fatalf("last page %d: Link %q", pages, link)
			}
			break
		}
		if want := `<http://chessd.test/v1/disputes?cursor=` + next + `&limit=2>; rel="next"`; link != want {
			t.Fatalf("page %d: Link %q, want %q", pages, link, want)
		}
		path = "/v1/disputes?limit=2&cursor=" + next
	}
	for i, id := range listed {
		if want := opened[len(opened)-1-i]; id != want {
			t.Fatalf("listed %v, want newest first of %v", listed, opened)
		}
	}
	if len(listed) != disputes {
		t.Fatalf("listed %d of %d", len(listed), disputes)
	}
	jobCursor := domain.PageCursor{At: time.Now(), ID: "job_x"}.Encode()
	for _, q := range []string{"limit=0", "limit=1001", "cursor=nope", "cursor=" + jobCursor, "limit=1&limit=2", "page=2"} {
		wantProblem(t, e.do("GET", "/v1/disputes?"+q, key, nil), 400, "fix_request")
	}
}
