package console_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"chessd/console"
)

// A failed job in the console: the Jobs page lists it with its problem's title, the
// detail and what to do next on hover, and the opened job says the same (a key revoked
// while its job waited: decisions.md's job error is a problem).
func TestConsoleShowsAFailedJobsProblem(t *testing.T) {
	if !console.New().Built() {
		t.Fatal("the console is not built into console/dist: run `make web`")
	}
	chromium := chromiumPath(t)
	server := startServer(t)
	base := validated(t, server)
	key := signup(t, server, "failed-job@example.com")

	// a job of a key revoked as soon as it is submitted: it fails as it starts, or at
	// its first record (ten positions at depth 14 do not end in between)
	doomed := createKey(t, server, key, `{"scopes":["jobs"],"label":"doomed"}`)
	fens := make([]string, 10)
	for i := range fens {
		fens[i] = fmt.Sprintf(`"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 %d"`, i+1)
	}
	status, body := apiCall(t, server, doomed.APIKey, "POST", "/v1/batch", `{"fens":[`+strings.Join(fens, ",")+`],"depth":14}`)
	var job struct {
		JobID string `json:"job_id"`
		State string `json:"state"`
		Error *struct {
			Title, Detail string
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &job); err != nil || status != 202 {
		t.Fatalf("POST /batch: %d %s", status, body)
	}
	if status, body := apiCall(t, server, key, "DELETE", "/v1/keys/"+doomed.KeyID, ""); status != 204 {
		t.Fatalf("revoking the job's key: %d %s", status, body)
	}
	deadline := time.Now().Add(time.Minute)
	for job.State != "failed" {
		if time.Now().After(deadline) {
			t.Fatalf("the job is %s, not failed", job.State)
		}
		time.Sleep(100 * time.Millisecond)
		_, body := apiCall(t, server, key, "GET", "/v1/jobs/"+job.JobID, "")
		if err := json.Unmarshal([]byte(body), &job); err != nil {
			t.Fatal(err)
		}
	}
	if job.Error == nil || job.Error.Title != "Invalid API key" || job.Error.Detail == "" {
		t.Fatalf("the failed job's error: %+v", job.Error)
	}
	want := "Invalid API key: " + job.Error.Detail + " Next: fix request."

	b := newBrowser(t, chromium, base)
	b.open("/jobs")
	b.setValue("#key-input", key)
	b.click(".keyform button[type=submit]")
	row := `document.querySelector('[data-testid=jobs-list] tr[data-job="` + job.JobID + `"]')`
	b.wait(`!!` + row)
	if got := b.eval(row + `.querySelector('[data-testid=listed-state]').textContent`); got != "failed: Invalid API key" {
		t.Errorf("the failed job is listed as %q, want its problem's title", got)
	}
	if got := b.eval(row + `.querySelector('[data-testid=listed-state]').title`); got != want {
		t.Errorf("the listed failed job's hover says %q, want %q", got, want)
	}
	b.eval(row + `.querySelector('button').click(), ''`)
	b.wait(`document.querySelector('[data-testid=job-state-name]')?.textContent === 'failed'`)
	if got := b.eval(`document.querySelector('[data-testid=job-error]')?.textContent ?? ''`); got != ": "+want {
		t.Errorf("the opened failed job says %q, want %q", got, ": "+want)
	}
	b.checkClean()
}
