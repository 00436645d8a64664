package httpapi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"chessd/httpapi"
)

// Two API servers and a job worker on one database, a key with a budget of 20 units:
// fifty concurrent cached evals (1 unit each) spread over both servers and a job
// (holding 10 units) race for it, a hundred times. No round spends more than the budget,
// whatever the servers' leases and the job's hold reserve meanwhile, and what is spent
// is exactly what was answered; a call refused over budget starts no engine.
func TestBudgetHoldsAcrossServers(t *testing.T) {
	a := newEnv(t, withWorkers(1))
	b := newEnv(t, onPool(a.pool), withWorkers(0))
	owner := a.signupPro("replicas-budget@example.com")
	warm := evalBody(cheapFEN, `"depth":10`)
	for _, e := range []*env{a, b} { // both servers find the position cached
		if r := e.do("POST", "/v1/eval", owner, warm); r.Status != 200 {
			t.Fatal(r.Raw)
		}
	}
	jobFEN := jobFENs(1)
	ctx := context.Background()
	for round := range 100 {
		key, keyID := a.createKey(owner, map[string]any{"label": fmt.Sprintf("round-%d", round), "scopes": []string{"eval", "jobs"},
			"budget_units": 20})
		var mu sync.Mutex
		count := map[int]int{}
		jobAccepted := false
		var jobID string
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				e := []*env{a, b}[i%2]
				r := e.do("POST", "/v1/eval", key, warm)
				mu.Lock()
				defer mu.Unlock()
				count[r.Status]++
				if r.Status == 402 && r.Body["next_action"] != "raise_budget" {
					t.Errorf("402 with next_action %v", r.Body["next_action"])
				}
				if r.Status == 200 && r.Body["cost_units"] != float64(1) {
					t.Errorf("cost %v", r.Body["cost_units"])
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.do("POST", "/v1/batch", key, map[string]any{"fens": jobFEN, "depth": 6})
			mu.Lock()
			defer mu.Unlock()
			switch r.Status {
			case 202:
				jobAccepted, jobID = true, r.Body["job_id"].(string)
			case 402:
			default:
				t.Errorf("batch: %d %s", r.Status, r.Raw)
			}
		}()
		wg.Wait()
		jobUnits := int64(0)
		if jobAccepted {
			job := a.waitJob(key, jobID, finished)
			jobUnits = int64(job["cost_units"].(float64))
		}
		for _, e := range []*env{a, b} {
			if err := e.meter.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var spent, held, budget int64
		if err := a.pool.QueryRow(ctx, `SELECT spent_units, held_units, budget_units FROM key_balances WHERE key_id = $1`, keyID).
			Scan(&spent, &held, &budget); err != nil {
			t.Fatal(err)
		}
		if spent+held > budget || spent != int64(count[200])+jobUnits || count[200]+count[402] != 50 || count[200] < 10 {
			t.Fatalf("round %d: %v, job accepted %v: spent %d and held %d of a budget of %d", round, count, jobAccepted, spent, held, budget)
		}
		if round == 99 { // spent: a fresh position is refused before any engine starts
			searches := a.searches(t)
			wantProblem(t, a.do("POST", "/v1/eval", key, evalBody(jobFENs(3)[2], `"depth":12`)), 402, "raise_budget")
			if n := a.searches(t) - searches; n != 0 {
				t.Fatalf("a call refused over budget ran %d searches", n)
			}
		}
		// done with: an account holds at most domain.MaxActiveKeys
		if r := a.do("DELETE", "/v1/keys/"+keyID, owner, nil); r.Status != 204 {
			t.Fatalf("revoke: %d %s", r.Status, r.Raw)
		}
	}
}

// Two servers hand out one address's keyless allowance in blocks: together they never
// answer more calls than the allowance, and once their idle blocks are given back the
// database counts exactly the calls answered.
func TestKeylessAllowanceAcrossServers(t *testing.T) {
	a := newEnv(t, withWorkers(0))
	b := newEnv(t, onPool(a.pool), withWorkers(0))
	body := evalBody(cheapFEN, `"depth":6`)
	if r := a.do("POST", "/v1/eval", "", body); r.Status != 200 { // cached from now on
		t.Fatal(r.Raw)
	}
	answered := 1
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range 80 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := []*env{a, b}[i%2].do("POST", "/v1/eval", "", body)
			mu.Lock()
			defer mu.Unlock()
			switch r.Status {
			case 200:
				answered++
			case 402:
				if r.Body["next_action"] != "sign_up" {
					t.Errorf("402 with next_action %v", r.Body["next_action"])
				}
			default:
				t.Errorf("keyless eval: %d %s", r.Status, r.Raw)
			}
		}()
	}
	wg.Wait()
	if answered > httpapi.KeylessPerDay || answered < httpapi.KeylessPerDay-30 {
		t.Fatalf("%d keyless calls answered by two servers, allowance %d", answered, httpapi.KeylessPerDay)
	}
	deadline := time.Now().Add(10 * time.Second)
	for calls := -1; calls != answered; {
		if err := a.pool.QueryRow(context.Background(), `SELECT calls FROM keyless_usage`).Scan(&calls); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the allowance counts %d calls, %d were answered", calls, answered)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
