package console_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"chessd/console"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// What the console shows is whole and of one book, in a real Chromium against a real
// chessd: an address verified with the mail's token pasted on the Account page (with a
// key and without one); with test usage beside the live, the Usage page's totals are
// the statement's (the calling key's book); a statement of more than one page (1,000
// charges) downloads whole as CSV; the secret of the key in use, rotated with no
// grace, stays shown (the console switching to it), and with grace the console switches
// too, its row still the key in use when rotated elsewhere; a budget of 0 is shown as
// one; and a lost key is replaced by mail (key recovery) without one.
func TestConsoleSecretsBooksAndVerificationInChromium(t *testing.T) {
	if !console.New().Built() {
		t.Fatal("the console is not built into console/dist: run `make web`")
	}
	chromium := chromiumPath(t)
	server, inbox, dbURL := startServerMail(t)
	base := validated(t, server)
	db := pgtest.NewDBAt(t, dbURL)
	key := signup(t, server, "books@example.com")
	other := signup(t, server, "other-books@example.com")

	// more than a page of live charges: one search, then 1,000 cached answers (a unit
	// each); and test usage, a test key's call (cached too), in the test book
	if status, body := evalCall(t, server, key); status != 200 {
		t.Fatalf("the live key's call: %d %s", status, body)
	}
	tester := createKey(t, server, key, `{"env":"test","scopes":["eval"],"label":"sandbox"}`)
	if status, body := evalCall(t, server, tester.APIKey); status != 200 {
		t.Fatalf("the test key's call: %d %s", status, body)
	}
	const cached = 1000
	start := time.Now()
	manyCalls(t, server, key, cached)
	t.Logf("%d cached calls in %v", cached, time.Since(start).Round(time.Millisecond))

	b := newBrowser(t, chromium, base)
	downloads := t.TempDir()
	b.do(chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.CallBrowser(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
			Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads})
		return err
	}))

	// Usage: the live key's page shows the live book, as its statement does; the test
	// key's call is in neither.
	b.open("/usage")
	b.setValue("#key-input", key)
	b.click(".keyform button[type=submit]")
	b.wait(`/charges/.test(document.querySelector('[data-testid=statement-totals]').textContent) && !!document.querySelector('[data-testid=usage-calls]')`)
	usageText := b.eval(`document.querySelector('[data-testid=usage-totals]').textContent`)
	stmtText := b.eval(`document.querySelector('[data-testid=statement-totals]').textContent`)
	usage := regexp.MustCompile(`([\d,]+) calls, ([\d,]+) units`).FindStringSubmatch(usageText)
	stmt := regexp.MustCompile(`([\d,]+) charges, ([\d,]+) units`).FindStringSubmatch(stmtText)
	const liveCalls, liveUnits = "1,001", "1,010" // the search (10 units) and the cached answers
	if stmt == nil || stmt[1] != liveCalls || stmt[2] != liveUnits {
		t.Errorf("the statement's totals read %q, want %s charges, %s units", stmtText, liveCalls, liveUnits)
	}
	if usage == nil || stmt == nil || usage[1] != stmt[1] || usage[2] != stmt[2] {
		t.Errorf("the Usage page's totals %q differ from its statement's %q", usageText, stmtText)
	}
	byKey := b.eval(`[...document.querySelectorAll('[data-testid=usage-key-table] tbody tr')].map(r => r.cells[0].textContent + '=' + r.cells[1].textContent).join('; ')`)
	if strings.Contains(byKey, tester.KeyID) || !regexp.MustCompile(`^[^(]+ \(key_\w+\)=1001$`).MatchString(byKey) {
		t.Errorf("usage by key shows %q, want the live key alone, by its label, with its 1001 calls", byKey)
	}
	byDay := b.eval(`[...document.querySelectorAll('[data-testid=usage-day-table] tbody tr')].map(r => r.cells[1].textContent).join()`)
	if byDay != "1001" {
		t.Errorf("usage by day shows calls %q, want one day of 1001", byDay)
	}

	// The statement as CSV: every charge, over both pages, one header row.
	b.click("[data-testid=statement-csv]")
	rows := downloadedCSV(t, downloads, "chessd-statement-")
	if len(rows) == 0 || len(rows[0]) == 0 || rows[0][0] != "charge_id" {
		t.Fatalf("the statement's CSV starts %v, want its header row", rows[:min(len(rows), 1)])
	}
	ids := map[string]bool{}
	for _, r := range rows[1:] {
		ids[r[0]] = true
	}
	if len(rows) != 1002 || len(ids) != 1001 {
		t.Errorf("the statement's CSV has %d rows and %d distinct charges, want a header and the 1001 charges", len(rows), len(ids))
	}

	// Keys: the key in use rotated with no grace. The console now uses the new secret,
	// and still shows it, once, to be copied.
	b.click(`nav a[href="/keys"]`)
	b.wait(`!!document.querySelector('[data-testid=keys] tr .badge')`)
	b.eval(`[...document.querySelectorAll('[data-testid=keys] tr')].find(r => r.querySelector('.badge')).querySelector('button[aria-label^=Rotate]').click(), ''`)
	b.wait(`document.querySelector('dialog').open`)
	b.click("[data-testid=dialog-submit]")
	b.wait(fmt.Sprintf(`sessionStorage.getItem('chessd.key') !== %q && !!document.querySelector('[data-testid=keys] tr .badge')`, key))
	rotated := b.eval(`sessionStorage.getItem('chessd.key')`)
	shown := b.eval(`(b => b.hidden ? 'hidden' : b.querySelector('[data-testid=secret]')?.textContent || 'empty')(document.querySelector('[data-testid=secret-box]'))`)
	if shown != rotated {
		t.Errorf("after rotating the key in use the secret box shows %q, want the new secret, %s…", shown, rotated[:12])
	}
	if status, _ := evalCall(t, server, key); status != 401 {
		t.Errorf("the rotated-away secret's call answered %d, want 401", status)
	}
	if status, body := evalCall(t, server, rotated); status != 200 {
		t.Errorf("the new secret's call answered %d %s", status, body)
	}

	// Rotated elsewhere with grace: the console's secret works on, under the old
	// prefix, and its row is still the key in use (by key_id: the listed prefix is the
	// new secret's). Rotated here with grace, the console switches to the new secret
	// as with none.
	keyID := b.eval(`document.querySelector('[data-testid=keys] tr .badge').closest('tr').dataset.keyId`)
	if status, body := apiCall(t, server, rotated, "POST", "/v1/keys/"+keyID+"/rotate", `{"grace_seconds":3600}`); status != 201 {
		t.Fatalf("POST /keys/%s/rotate: %d %s", keyID, status, body)
	}
	b.open("/keys")
	b.wait(fmt.Sprintf(`!!document.querySelector('[data-testid=keys] tr[data-key-id=%s]')`, keyID))
	if badge := b.eval(fmt.Sprintf(`String(!!document.querySelector('[data-testid=keys] tr[data-key-id=%s] .badge'))`, keyID)); badge != "true" {
		t.Errorf("after a rotation with grace elsewhere, the row of the key in use (%s) is not marked as this key", keyID)
	}
	b.eval(fmt.Sprintf(`document.querySelector('[data-testid=keys] tr[data-key-id=%s] button[aria-label^=Rotate]').click(), ''`, keyID))
	b.wait(`document.querySelector('dialog').open`)
	b.setValue("dialog input[name=grace_seconds]", "60")
	b.click("[data-testid=dialog-submit]")
	b.wait(fmt.Sprintf(`sessionStorage.getItem('chessd.key') !== %q && !!document.querySelector('[data-testid=keys] tr .badge')`, rotated))
	graced := rotated
	rotated = b.eval(`sessionStorage.getItem('chessd.key')`)
	if status, body := evalCall(t, server, graced); status != 200 {
		t.Errorf("the secret rotated away with 60 s of grace answered %d %s, want 200 within its grace", status, body)
	}

	// A budget of 0 is a budget (every costed call refused), not none.
	if status, body := apiCall(t, server, rotated, "PATCH", "/v1/me", `{"budget_units":0}`); status != 200 {
		t.Fatalf("PATCH /me: %d %s", status, body)
	}
	b.click(`nav a[href="/usage"]`)
	b.wait(`/Account budget/.test(document.querySelector('[data-testid=budgets]')?.textContent || '')`)
	if row := b.eval(`[...document.querySelectorAll('[data-testid=budgets] tr')].find(r => /Account budget/.test(r.textContent)).textContent`); !strings.Contains(row, "of 0 units") {
		t.Errorf("with an account budget of 0 units the Usage page reads %q, want its spend \"of 0 units\"", row)
	}

	// With the key: the Account page says the address is not verified and takes the
	// mail's token; a wrong one is refused as the API refuses it, the right one
	// verifies the address.
	b.click(`nav a[href="/account"]`)
	b.wait(`/not verified/.test(document.querySelector('[data-testid=account]')?.textContent || '')`)
	token := mailToken(t, inbox, "books@example.com", server, 1)
	if b.eval(`String(!!document.querySelector('[data-testid=verify-token]'))`) != "true" {
		t.Fatal("the Account page of an unverified address has no field for the mail's token")
	}
	b.setValue("[data-testid=verify-token]", token+"0")
	b.expectFailure("POST", "/v1/verify-email", 400)
	b.click("[data-testid=verify-submit]")
	b.wait(`/token/.test(document.querySelector('.alert.error')?.textContent || '')`)
	b.setValue("[data-testid=verify-token]", token)
	b.click("[data-testid=verify-submit]")
	b.wait(`/\(verified\)/.test(document.querySelector('[data-testid=account]').textContent)`)
	if status := meVerified(t, server, rotated); status != "true" {
		t.Errorf("after the token was pasted, GET /me says email_verified %s", status)
	}

	// Without a key (the mail opened in a new tab): the token pasted on the Account
	// page verifies the address.
	b.click("#keybar button")
	b.wait(`!!document.querySelector('[data-testid=verify-token]')`)
	b.setValue("[data-testid=verify-token]", mailToken(t, inbox, "other-books@example.com", server, 1))
	b.click("[data-testid=verify-submit]")
	b.wait(`/other-books@example\.com.*verified/.test(document.querySelector('.alert.notice')?.textContent || '')`)
	if status := meVerified(t, server, other); status != "true" {
		t.Errorf("after the token was pasted keyless, GET /me says email_verified %s", status)
	}

	// Still without a key: every key of the account lost, a new one by mail (the
	// signup's message a minute ago), shown once and in use in the tab.
	if _, err := db.Exec(context.Background(), `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	b.setValue("[data-testid=recover-email]", "Other-Books@example.com")
	b.click("[data-testid=recover-submit]")
	b.wait(`/other-books@example\.com.*on its way/.test(document.querySelector('.alert.notice')?.textContent || '')`)
	b.setValue("[data-testid=recover-token]", mailToken(t, inbox, "other-books@example.com", server, 2))
	b.click("[data-testid=recover-revoke]")
	b.click("[data-testid=recover-confirm]")
	b.wait(`!!document.querySelector('[data-testid=signup-secret]') && /new key/.test(document.querySelector('.secret').textContent)`)
	recovered := b.eval(`sessionStorage.getItem('chessd.key')`)
	if shown := b.eval(`document.querySelector('[data-testid=signup-secret]').textContent`); shown != recovered || recovered == other {
		t.Errorf("after key recovery the page shows %q and the tab uses %q, want the new secret in both", shown, recovered)
	}
	if status := meVerified(t, server, recovered); status != "true" {
		t.Errorf("the recovered key's GET /me says email_verified %s", status)
	}
	if status, _ := apiCall(t, server, other, "GET", "/v1/me", ""); status != 401 {
		t.Errorf("the account's signup key, recovered with its other keys revoked, answered %d, want 401", status)
	}

	b.checkClean()
}

type newKey struct {
	APIKey string `json:"api_key"`
	KeyID  string `json:"key_id"`
}

// createKey is POST /keys with key, outside the browser.
func createKey(t *testing.T, base, key, body string) newKey {
	t.Helper()
	status, res := apiCall(t, base, key, "POST", "/v1/keys", body)
	var k newKey
	if err := json.Unmarshal([]byte(res), &k); err != nil || status != 201 {
		t.Fatalf("POST /keys: %d %v %s", status, err, res)
	}
	return k
}

// apiCall makes one call with key, outside the browser, and answers its status and body.
func apiCall(t *testing.T, base, key, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// manyCalls makes n of evalCall's evaluations with key, four at a time (after a first
// one, they are answered from the cache).
func manyCalls(t *testing.T, base, key string, n int) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	next := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for range next {
				req, _ := http.NewRequest("POST", base+"/v1/eval", strings.NewReader(`{"fen":"8/8/8/4k3/8/8/3QK3/8 w - - 0 1","depth":6}`))
				req.Header.Set("Authorization", "Bearer "+key)
				res, err := http.DefaultClient.Do(req)
				if err == nil {
					io.Copy(io.Discard, res.Body) //nolint:errcheck // the status says enough
					res.Body.Close()
					if res.StatusCode != 200 {
						err = fmt.Errorf("status %d", res.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d calls failed, the first: %s", len(errs), n, errs[0])
	}
}

// mailToken waits for the n-th message (from 1) sent to email and reads its token (a
// verification's ev_… or a recovery's rk_…), checking the message points to the
// console's Account page.
func mailToken(t *testing.T, inbox *mailtest.Inbox, email, server string, n int) string {
	t.Helper()
	token := inbox.WaitToken(t, email, n)
	if body := inbox.To(email)[n-1].Data; !strings.Contains(body, server+"/account") {
		t.Errorf("the message does not point to the console's Account page (%s/account):\n%s", server, body)
	}
	return token
}

// meVerified answers GET /me's email_verified for key.
func meVerified(t *testing.T, base, key string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/me", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var me struct {
		Verified bool `json:"email_verified"`
	}
	if err := json.NewDecoder(res.Body).Decode(&me); err != nil || res.StatusCode != 200 {
		t.Fatalf("GET /me: %d %v", res.StatusCode, err)
	}
	return fmt.Sprint(me.Verified)
}

// downloadedCSV waits for the browser to finish downloading a file whose name starts
// with prefix into dir, and answers its rows. The file can appear under its name
// before its bytes are written (a CI run read it empty), so it is done once it is not
// empty, ends a line, and has kept its size from one look to the next.
func downloadedCSV(t *testing.T, dir, prefix string) [][]string {
	t.Helper()
	var name string
	var data []byte
	size := -1
	pgtest.WaitFor(t, "the download of "+prefix+"…", func() bool {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".crdownload") {
				return false // Chromium is still writing
			}
			if strings.HasPrefix(e.Name(), prefix) && strings.HasSuffix(e.Name(), ".csv") {
				name = e.Name()
			}
		}
		if name == "" {
			return false
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		last := size
		data, size = b, len(b)
		return err == nil && size > 0 && size == last && b[size-1] == '\n'
	})
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return rows
}
