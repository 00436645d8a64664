package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"chessd/commands"
	"chessd/domain"
	"chessd/ledger"
)

var usageExplain = flag.Bool("usage-explain", false, "usage part: print EXPLAIN ANALYZE of the statement's first page and of GET /usage's sums")

// usageAll measures GET /usage and the statement's first page for one account with
// many charges over the last 30 days: the charges read model is seeded with COPY, row
// for row what the inline writer stores for such charges (no events: these reads never
// look at the log), and usage_hours recomputed from it as migration 0023 backfills it.
// Then, through the HTTP server: GET /usage?group_by=key,day over the month (UTC, and
// New York across the end of daylight saving), GET /usage/charges' first page, each
// `calls` times; and for comparison the sums from the charges alone (ledger.Usage with
// Exact) and the statement's totals as they were summed before the rollup.
func (b *bench) usageAll(ctx context.Context, charges, credits, calls int) error {
	fmt.Printf("\n## Usage and statement at %d charges\n\n", charges)
	var su struct {
		APIKey    string `json:"api_key"`
		AccountID string `json:"account_id"`
		KeyID     string `json:"key_id"`
	}
	if err := b.post(b.url, "/signup", `{"email":"usage-bench@example.com"}`, "", &su); err != nil {
		return err
	}
	if err := b.cmds.ChangePlan(ctx, su.AccountID, domain.PlanPro, "benchmark"); err != nil {
		return err
	}
	admin, err := commands.LoadKey(ctx, b.pool, su.KeyID)
	if err != nil {
		return err
	}
	keys := []string{su.KeyID}
	for i := range 4 {
		k, _, err := b.cmds.CreateKey(ctx, commands.Actor{Key: admin}, domain.KeySettings{Label: fmt.Sprintf("usage %d", i),
			Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
		if err != nil {
			return err
		}
		keys = append(keys, k.ID())
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	from, to := today.AddDate(0, 0, -30), today

	seeded := time.Now()
	if err := ledger.SeedBenchCharges(ctx, b.pool, su.AccountID, keys, from, to, charges, credits); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	seedTook := time.Since(seeded)
	refreshed := time.Now()
	if err := ledger.RefreshRollup(ctx, b.pool); err != nil {
		return err
	}
	refreshTook := time.Since(refreshed)
	hours, err := ledger.PrepareForReads(ctx, b.pool, su.AccountID)
	if err != nil {
		return err
	}
	fmt.Printf("One account, %d live keys, %d charges over the 30 days from %s to %s (eval, bestmove, analyze and batch positions, "+
		"two engines, 30%% cached, depths 8 to 20) and %d credits, COPYed into charges and credits as the inline writer stores them "+
		"in %s; the rollups recomputed from them (usage_refresh, the migrations' backfill and a rebuild's last step) in %s: %d rows; "+
		"then VACUUM (ANALYZE). Each request %d times after 3 warm-up requests, one at a time, through the HTTP server (auth included).\n\n",
		len(keys), charges, from.Format(time.DateOnly), to.AddDate(0, 0, -1).Format(time.DateOnly), credits,
		seedTook.Round(time.Second), refreshTook.Round(10*time.Millisecond), hours, calls)

	span := url.Values{"from": {from.Format(time.DateOnly)}, "to": {to.AddDate(0, 0, -1).Format(time.DateOnly)}}
	type row struct {
		what, how string
		times     []time.Duration
		target    time.Duration
	}
	var out []row
	for _, tz := range []string{"UTC", "America/New_York"} {
		q := url.Values{"group_by": {"key,day"}, "tz": {tz}, "from": span["from"], "to": span["to"]}
		var body struct {
			Groups []json.RawMessage `json:"groups"`
			Totals struct {
				Calls int64 `json:"calls"`
			} `json:"totals"`
		}
		times, err := b.timedGets("/usage?"+q.Encode(), su.APIKey, calls, &body)
		if err != nil {
			return err
		}
		if body.Totals.Calls == 0 || len(body.Groups) == 0 {
			return fmt.Errorf("GET /usage %s: %d groups, %d calls", tz, len(body.Groups), body.Totals.Calls)
		}
		out = append(out, row{fmt.Sprintf("GET /usage?group_by=key,day, a month, tz=%s (%d groups, %d calls)", tz, len(body.Groups), body.Totals.Calls),
			"HTTP, usage_hours", times, 100 * time.Millisecond})
		// the same sums from the charges alone, as before the rollup
		loc, _ := time.LoadLocation(tz)
		lf, _ := time.ParseInLocation(time.DateOnly, span.Get("from"), loc)
		lt, _ := time.ParseInLocation(time.DateOnly, span.Get("to"), loc)
		uq := ledger.UsageQuery{AccountID: su.AccountID, From: lf, To: lt.AddDate(0, 0, 1), Zone: tz, GroupBy: []string{"key", "day"},
			Limit: 1000, Exact: true}
		var exact []time.Duration
		for i := range 3 + max(3, calls/10) {
			start := time.Now()
			rep, err := ledger.Usage(ctx, b.pool, uq)
			if err != nil {
				return err
			}
			if i >= 3 {
				exact = append(exact, time.Since(start))
			}
			if rep.Rollup || rep.Calls != body.Totals.Calls {
				return fmt.Errorf("exact usage: %d calls, rollup %v; /usage said %d", rep.Calls, rep.Rollup, body.Totals.Calls)
			}
		}
		out = append(out, row{"the same sums from charges and credits (Exact)", "ledger.Usage, no HTTP", exact, 0})
	}

	var page struct {
		Charges []json.RawMessage `json:"charges"`
	}
	times, err := b.timedGets("/usage/charges", su.APIKey, calls, &page)
	if err != nil {
		return err
	}
	if len(page.Charges) == 0 {
		return fmt.Errorf("GET /usage/charges: no charges")
	}
	out = append(out, row{fmt.Sprintf("GET /usage/charges, first page (%d charges, totals of all)", len(page.Charges)), "HTTP", times, 50 * time.Millisecond})
	times, err = b.timedGets("/usage/charges?"+span.Encode()+"&limit=1000", su.APIKey, calls, &page)
	if err != nil {
		return err
	}
	out = append(out, row{fmt.Sprintf("GET /usage/charges?from=..&to=..&limit=1000, first page (%d charges)", len(page.Charges)), "HTTP", times, 0})
	// the statement's totals as they were summed before: every charge of the range
	var before []time.Duration
	for i := range 3 + max(3, calls/10) {
		start := time.Now()
		if _, err := ledger.CountLiveCharges(ctx, b.pool, su.AccountID); err != nil {
			return err
		}
		if i >= 3 {
			before = append(before, time.Since(start))
		}
	}
	out = append(out, row{"the statement's totals summed from the charges (before)", "SQL, no HTTP", before, 0})

	fmt.Println("| request | how | n | p50 ms | p99 ms | target |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, r := range out {
		target := "–"
		if r.target > 0 {
			verdict := "met"
			if percentile(r.times, 0.99) >= r.target {
				verdict = "**not met**"
			}
			target = fmt.Sprintf("< %d ms: %s", r.target.Milliseconds(), verdict)
		}
		fmt.Printf("| %s | %s | %d | %.1f | %.1f | %s |\n", r.what, r.how, len(r.times), ms(percentile(r.times, 0.5)), ms(percentile(r.times, 0.99)), target)
	}
	if *usageExplain {
		return ledger.ExplainUsage(ctx, b.pool, su.AccountID)
	}
	return nil
}

// timedGets GETs path `n` times after 3 untimed ones and returns the times; out gets
// the last answer.
func (b *bench) timedGets(path, key string, n int, out any) ([]time.Duration, error) {
	var times []time.Duration
	for i := range 3 + n {
		req, _ := http.NewRequest("GET", b.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		res, err := b.client.Do(req)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(res.Body)
		res.Body.Close()
		took := time.Since(start)
		if err != nil {
			return nil, err
		}
		if res.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %d %s", path, res.StatusCode, raw)
		}
		if i >= 3 {
			times = append(times, took)
		}
		if i == 2+n {
			if err := json.Unmarshal(raw, out); err != nil {
				return nil, err
			}
		}
	}
	return times, nil
}

// percentile is the p-th (0..1) of d, nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}
