package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"chessd/console"
	"chessd/mail/mailtest"
	"chessd/openapi/openapitest"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The console in a real Chromium against a real chessd (its own binary, PostgreSQL and
// Stockfish): the playground's live evaluation, a job to its end, keys created and
// revoked, usage showing what was just done; on every page no console error, no failed
// request, and every control reachable with Tab. Screenshots are taken every run; they
// go to docs/screenshots with CHESSD_SCREENSHOTS set (`make screenshots`).
func TestConsoleInChromium(t *testing.T) {
	if !console.New().Built() {
		t.Fatal("the console is not built into console/dist: run `make web`")
	}
	chromium := chromiumPath(t)
	cut := &streamCut{}
	base := cut.front(t, validated(t, startServer(t)))
	key := signup(t, base, "console@example.com")
	// the console's pages beside the API, whose unknown paths stay problem+json
	for path, want := range map[string]string{"/keys": "text/html; charset=utf-8", "/v1/keys/nope/x": "application/problem+json", "/nope": "application/problem+json"} {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if got := res.Header.Get("Content-Type"); got != want {
			t.Errorf("GET %s: %d %s, want %s", path, res.StatusCode, got, want)
		}
	}
	b := newBrowser(t, chromium, base)
	shots := screenshotDir(t)

	// Playground, keyless: 1.e4 e5 2.Nf3 on the board, then a depth-12 evaluation.
	b.open("/play")
	b.wait(`document.querySelectorAll('cg-board piece').length === 32`)
	for _, mv := range []string{"e2e4", "e7e5", "g1f3"} {
		b.boardMove(mv)
	}
	b.wait(`document.querySelector('[data-testid=moves]').textContent === 'e4e5Nf3'`)
	const afterNf3 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2"
	if fen := b.eval(`document.querySelector('[data-testid=fen]').value`); fen != afterNf3 {
		t.Fatalf("after 1.e4 e5 2.Nf3 the board is at %q", fen)
	}
	b.setValue("[data-testid=depth]", "12")
	b.click("[data-testid=analyse]")
	b.wait(`!!document.querySelector('[data-testid=charged-units]')`)
	depths := b.searchLog()
	checkDeepens(t, depths, 12)
	if got := b.eval(`document.querySelector('[data-testid=charged-units]').textContent`); got != "0 units" {
		t.Errorf("a keyless evaluation shows it was charged %q", got)
	}
	pv := b.pvLine()
	checkSAN(t, pv)
	// a PV move played from the board: Black's reply lands on the board
	b.click("[data-testid=pv-move]")
	b.wait(`document.querySelector('[data-testid=moves]').children.length === 4`)
	if last := b.eval(`document.querySelector('[data-testid=moves]').lastElementChild.textContent`); last != pv[0] {
		t.Errorf("clicking the PV's first move %q played %q", pv[0], last)
	}
	b.click("[data-testid=undo]")
	b.wait(`document.querySelector('[data-testid=moves]').children.length === 3`)
	// the same without a pointer: focus the board, walk its cursor from a1 to b8, pick
	// the knight up, walk to c6, put it down (real key presses)
	b.eval(`document.querySelector('[data-testid=board]').focus(), ''`)
	b.wait(`document.querySelector('[data-testid=board-live]').textContent.startsWith('a1, white rook')`)
	keys := []string{kb.ArrowRight}
	for range 7 {
		keys = append(keys, kb.ArrowUp)
	}
	keys = append(keys, kb.Enter, kb.ArrowRight, kb.ArrowDown, kb.ArrowDown, kb.Enter)
	for _, k := range keys {
		b.do(chromedp.KeyEvent(k))
	}
	b.wait(`document.querySelector('[data-testid=moves]').textContent === 'e4e5Nf3Nc6'`)
	if live := b.eval(`document.querySelector('[data-testid=board-live]').textContent`); !strings.HasPrefix(live, "c6, black knight") {
		t.Errorf("after the keyboard's move the board announces %q", live)
	}
	b.click("[data-testid=undo]")
	b.wait(`document.querySelector('[data-testid=moves]').children.length === 3`)

	// The analysed position shows its best move as an arrow; a new position drops the
	// analysis: after analysing a position set by FEN, the start position (no moves
	// either) shows neither its arrow nor its evaluation.
	const arrows = `document.querySelectorAll('[data-testid=board] svg.cg-shapes line').length`
	b.wait(arrows + ` === 1`)
	b.setValue("[data-testid=fen]", "4k3/8/8/8/8/8/4P3/4K3 w - - 0 1")
	b.eval(`document.querySelector('[data-testid=fen]').form.requestSubmit(), ''`)
	b.wait(`document.querySelector('[data-testid=game-status]').textContent === 'White to move' && document.querySelector('[data-testid=moves]').children.length === 0`)
	b.click("[data-testid=analyse]")
	b.wait(`!!document.querySelector('[data-testid=charged-units]') && ` + arrows + ` === 1`)
	b.click("[data-testid=start-position]")
	b.wait(`document.querySelectorAll('cg-board piece').length === 32`)
	b.wait(arrows + ` === 0 && document.querySelector('[data-testid=eval]').textContent === '–' && !document.querySelector('[data-testid=pv]')`)
	// back to 1.e4 e5 2.Nf3 by PGN, for what follows
	b.setValue("textarea[name=pgn]", "1. e4 e5 2. Nf3")
	b.eval(`document.querySelector('textarea[name=pgn]').form.requestSubmit(), ''`)
	b.wait(`document.querySelector('[data-testid=moves]').textContent === 'e4e5Nf3'`)

	// With a key: the price before, MultiPV 2, and what was charged after.
	b.setValue("#key-input", key)
	b.click(".keyform button[type=submit]")
	b.wait(`!!document.querySelector('[data-testid=price-units]')`)
	b.setValue("[data-testid=depth]", "14")
	b.setValue("[data-testid=multipv]", "2")
	b.wait(`document.querySelector('[data-testid=price-units]')?.textContent === '30 units'`)
	b.click("[data-testid=analyse]")
	b.wait(`!!document.querySelector('[data-testid=charged-units]')`)
	checkDeepens(t, b.searchLog(), 14)
	if got := b.eval(`document.querySelector('[data-testid=charged-units]').textContent`); got != "30 units" {
		t.Errorf("the keyed depth-14 MultiPV-2 evaluation shows it was charged %q, want the 30 units quoted", got)
	}
	if n := b.eval(`String(document.querySelectorAll('[data-testid=pv]').length)`); n != "2" {
		t.Errorf("MultiPV 2 shows %s lines", n)
	}
	b.screenshot(shots, "playground.png")
	b.tabThrough("playground")

	// Jobs: a PGN analysed, followed live to 100 %, then the graph and the stepper.
	b.click(`nav a[href="/jobs"]`)
	b.wait(`!!document.querySelector('[data-testid=job-input]')`)
	const pgn = "[Event \"e2e\"]\n\n1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 *"
	b.setValue("[data-testid=job-input]", pgn)
	b.setValue("input[name=depth]", "8")
	b.wait(`/10 positions/.test(document.querySelector('[data-testid=job-price]').textContent)`)
	b.click("[data-testid=job-submit]")
	b.wait(`document.querySelector('[data-testid=job-state-name]')?.textContent === 'succeeded'`)
	if got := b.eval(`document.querySelector('[data-testid=job-progress-text]').textContent`); got != "10/10 (100%)" {
		t.Errorf("the finished job's progress reads %q", got)
	}
	if got := b.eval(`(p => p.value + '/' + p.max)(document.querySelector('[data-testid=job-progress]'))`); got != "10/10" {
		t.Errorf("the progress bar stands at %s", got)
	}
	if got := b.eval(`String(document.querySelector('[data-testid=job-positions]').children.length)`); got != "10" {
		t.Errorf("%s positions were shown as they finished, want 10", got)
	}
	b.wait(`document.querySelector('[data-testid=eval-graph]')?.dataset.points === '10'`)
	// the job is listed (GET /jobs) with its final state
	b.wait(`[...document.querySelectorAll('[data-testid=jobs-list] tr')].some(r => r.querySelector('[data-testid=listed-state]')?.textContent === 'succeeded')`)
	b.click("[data-testid=step-next]")
	b.click("[data-testid=step-next]")
	b.wait(`document.querySelector('[data-testid=review-caption]').textContent.startsWith('Position 3 of 10 (1… e5)')`)
	b.screenshot(shots, "jobs.png")
	b.tabThrough("jobs")

	// A proxy ends the job's event stream cleanly, without `end`, again and again: the
	// page reconnects no sooner than the server's retry: hint (1 s), not in a tight
	// loop, and follows the job to its end once the stream gets through.
	cut.set(true)
	b.click("[data-testid=jobs-list] button")
	b.wait(`document.querySelector('[data-testid=job-positions]').children.length === 0`)
	time.Sleep(2500 * time.Millisecond)
	asked := cut.set(false)
	if len(asked) < 2 || len(asked) > 4 {
		t.Errorf("in 2.5 s of cut streams the page asked for the job's events %d times, want 2 to 4", len(asked))
	}
	for i := 1; i < len(asked); i++ {
		if gap := asked[i].Sub(asked[i-1]); gap < 950*time.Millisecond {
			t.Errorf("the page reconnected to a cut stream after %v, before the server's retry: 1000", gap)
			break
		}
	}
	b.wait(`document.querySelector('[data-testid=job-state-name]')?.textContent === 'succeeded' && document.querySelector('[data-testid=job-positions]').children.length === 10`)

	// The stream refused for a while (429 with Retry-After, as when the account has too
	// many open): the page waits that long, asks again, and follows the job to its end.
	cut.refuseNext(1)
	jobID := b.eval(`document.querySelector('section.job code').textContent`)
	b.expectFailure("GET", "/v1/jobs/"+jobID+"/events", 429)
	// clicked in the page: the list is redrawn as the last follow ends, and a node
	// looked up first can be gone by the time it is clicked
	b.eval(`document.querySelector('[data-testid=jobs-list] button').click(), ''`)
	b.wait(`document.querySelector('[data-testid=job-positions]').children.length === 0`)
	b.wait(`document.querySelector('[data-testid=job-positions]').children.length === 10 && document.querySelector('[data-testid=job-state-name]')?.textContent === 'succeeded'`)
	if asked := cut.set(false); len(asked) < 2 || asked[1].Sub(asked[0]) < 1950*time.Millisecond {
		t.Errorf("after a 429 with Retry-After: 2 the page asked again at %v", asked)
	}

	// Another account's key: the page starts afresh, neither following the first
	// account's job (its events would answer 404) nor showing its PGN.
	other := signup(t, base, "other@example.com")
	b.click("#keybar button")
	b.setValue("#key-input", other)
	b.click(".keyform button[type=submit]")
	b.wait(`document.querySelector('[data-testid=jobs-list]')?.textContent === 'No jobs yet.'`)
	if got := b.eval(`JSON.stringify([document.querySelector('[data-testid=job-input]').value, document.querySelector('section.job').hidden])`); got != `["",true]` {
		t.Errorf("with another account's key the jobs page shows [input, job hidden] %s, want a fresh page", got)
	}
	b.click("#keybar button")
	b.setValue("#key-input", key)
	b.click(".keyform button[type=submit]")
	b.wait(`!!document.querySelector('[data-testid=jobs-list] button')`)

	// Keys: a refusal shown as the API gave it, a key created, used, revoked, refused.
	b.click(`nav a[href="/keys"]`)
	b.wait(`document.querySelectorAll('[data-testid=keys] tr').length === 1`)
	b.setValue("[data-testid=new-label]", strings.Repeat("x", 101))
	b.expectFailure("POST", "/v1/keys", 400)
	b.click("[data-testid=create-key]")
	b.wait(`/label/.test(document.querySelector('.alert.error')?.textContent || '')`)
	b.setValue("[data-testid=new-label]", "e2e temp")
	b.click("[data-testid=create-key]")
	b.wait(`/^ce_live_/.test(document.querySelector('[data-testid=secret]')?.textContent || '')`)
	secret := b.eval(`document.querySelector('[data-testid=secret]').textContent`)
	b.wait(`[...document.querySelectorAll('[data-testid=keys] tr')].some(r => r.textContent.includes('e2e temp'))`)
	b.click("[data-testid=copy-secret]")
	b.wait(`/Copied|Selected/.test(document.querySelector('[data-testid=secret-box]').textContent)`)
	if status, _ := evalCall(t, base, secret); status != 200 {
		t.Fatalf("the new key's call answered %d", status)
	}
	b.screenshot(shots, "keys.png")
	b.tabThrough("keys")
	b.click(`[data-testid=keys] tr:last-child [data-testid=revoke]`)
	b.wait(`document.querySelector('dialog').open`)
	b.click("[data-testid=dialog-submit]")
	b.wait(`document.querySelector('[data-testid=keys] tr:last-child').dataset.status === 'revoked'`)
	if status, body := evalCall(t, base, secret); status != 401 || !strings.Contains(body, "invalid-credential") {
		t.Fatalf("the revoked key's call answered %d %s", status, body)
	}

	// Usage: today's calls by day and by key, the statement, the budgets.
	b.click(`nav a[href="/usage"]`)
	b.wait(`document.querySelectorAll('[data-testid=statement] tr[data-charge-id]').length > 0`)
	// this session's charges: the keyed evaluation, 10 job positions, the new key's call
	if got := b.eval(`document.querySelector('[data-testid=usage-calls]').textContent`); got != "12 calls" {
		t.Errorf("usage shows %q, want the 12 calls just made", got)
	}
	if got := b.eval(`[...document.querySelectorAll('[data-testid=usage-day-table] tbody tr')].map(r => r.cells[1].textContent).join()`); got != "12" {
		t.Errorf("the chart by day has calls %q, want one day of 12", got)
	}
	byKey := b.eval(`[...document.querySelectorAll('[data-testid=usage-key-table] tbody tr')].map(r => r.cells[0].textContent.split(' (')[0] + '=' + r.cells[1].textContent).sort().join()`)
	if !strings.Contains(byKey, "e2e temp=1") || !strings.Contains(byKey, "=11") {
		t.Errorf("the chart by key shows %q, want the new key's call and the signup key's 11", byKey)
	}
	if got := b.eval(`String(document.querySelectorAll('[data-testid=statement] tr[data-charge-id]').length)`); got != "12" {
		t.Errorf("the statement lists %s charges, want 12", got)
	}
	b.wait(`!!document.querySelector('[data-testid=usage-by-day]').width`)
	b.screenshot(shots, "usage.png")
	b.tabThrough("usage")

	// Account: the portal's page.
	b.click(`nav a[href="/account"]`)
	b.wait(`document.querySelector('[data-testid=plan]')?.textContent.startsWith('free')`)
	b.screenshot(shots, "account.png")
	b.tabThrough("account")

	// A phone: the playground fits its width.
	b.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
	b.open("/play")
	b.wait(`document.querySelectorAll('cg-board piece').length > 0`)
	if got := b.eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); got != "true" {
		t.Errorf("on a phone the page scrolls sideways: %s; wider than the screen: %s", b.eval(`document.documentElement.scrollWidth + ' > ' + window.innerWidth`),
			b.eval(`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).slice(0, 8).join(', ')`))
	}
	b.screenshot(shots, "playground-phone.png")

	b.checkClean()
}

// checkDeepens: the live evaluation reported depths in increasing order, to the one asked.
func checkDeepens(t *testing.T, depths []int, want int) {
	t.Helper()
	if len(depths) < 2 || depths[len(depths)-1] != want {
		t.Fatalf("the search log shows depths %v, want several up to %d", depths, want)
	}
	for i := 1; i < len(depths); i++ {
		if depths[i] <= depths[i-1] {
			t.Fatalf("the depths did not deepen: %v", depths)
		}
	}
}

var sanMove = regexp.MustCompile(`^(O-O(-O)?|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|[a-h](x[a-h])?[1-8](=[QRBN])?)[+#]?$`)

func checkSAN(t *testing.T, moves []string) {
	t.Helper()
	if len(moves) == 0 {
		t.Fatal("the PV is empty")
	}
	for _, m := range moves {
		if !sanMove.MatchString(m) {
			t.Fatalf("the PV %v holds %q, which is not SAN", moves, m)
		}
	}
}

// streamCut stands in front of the server as a proxy could: while on, it ends every job
// event stream cleanly at once, after the server's retry: hint and without `end`; it
// answers the next refuse requests for a stream as the server does when an account
// has too many open (429, Retry-After: 2); and it notes when each stream was asked for.
type streamCut struct {
	mu     sync.Mutex
	on     bool
	refuse int
	asked  []time.Time
}

// set turns the cutting on or off, answering when the streams were asked for since the
// last set.
func (c *streamCut) set(on bool) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	asked := c.asked
	c.on, c.asked = on, nil
	return asked
}

// refuseNext has the next n stream requests refused with 429 (and starts noting afresh).
func (c *streamCut) refuseNext(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse, c.asked = n, nil
}

func (c *streamCut) front(t *testing.T, base string) string {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/jobs/") && strings.HasSuffix(r.URL.Path, "/events") {
			c.mu.Lock()
			on, refused := c.on, c.refuse > 0
			if refused {
				c.refuse--
			}
			c.asked = append(c.asked, time.Now())
			c.mu.Unlock()
			if refused {
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, `{"type":"about:blank","title":"Too many requests","status":429,"detail":"this account already has 100 job event streams open on this server","next_action":"retry_after"}`)
				return
			}
			if on {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "retry: 1000\n\n")
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// chromiumPath is Debian's chromium, installed by `make chromium` (scripts/install-chromium.sh).
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("CHESSD_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no Chromium at %s: run `make chromium` (scripts/install-chromium.sh)", p)
	}
	return p
}

// screenshotDir is where the screenshots go: docs/screenshots with CHESSD_SCREENSHOTS
// set (`make screenshots`), else the test's own directory, so that `make test` leaves
// the checkout as it found it.
func screenshotDir(t *testing.T) string {
	t.Helper()
	if os.Getenv("CHESSD_SCREENSHOTS") == "" {
		return t.TempDir()
	}
	dir, err := filepath.Abs(filepath.Join("..", "docs", "screenshots"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// validated puts a proxy in front of the server at base that runs every exchange the
// browser makes through the OpenAPI document's validator (paths outside the document,
// the console's pages and assets, are not checked), and answers the proxy's address.
func validated(t *testing.T, base string) string {
	t.Helper()
	v, err := openapitest.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // the live evaluation and job streams pass at once
	srv := httptest.NewServer(v.Handler(proxy, func(req *http.Request, msg string) {
		t.Errorf("OpenAPI: %s %s: %s", req.Method, req.URL.Path, msg)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// startServer builds chessd and runs `chessd serve` on a fresh database; it answers
// the server's root address.
func startServer(t *testing.T) string {
	t.Helper()
	base, _, _ := startServerMail(t)
	return base
}

// startServerMail is startServer answering the SMTP server the server's mail goes to
// too, where a test reads a verification token as its recipient does, and its
// database's URL.
func startServerMail(t *testing.T) (string, *mailtest.Inbox, string) {
	t.Helper()
	inbox := mailtest.Start(t, mailtest.Config{})
	bin := filepath.Join(t.TempDir(), "chessd")
	build := exec.Command("go", "build", "-o", bin, "chessd/cmd/chessd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	dbURL := pgtest.URL(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, fmt.Sprintf("PORT=%d", port), "LOG_LEVEL=error",
		"CHESSD_BASE_URL="+base+"/v1", "CHESSD_KEY_PEPPER=console-test-pepper-0123456789", "CHESSD_RATE_LIMITS=off",
		"CHESSD_ENGINE_POOL_SIZE=1", "CHESSD_METRICS_ADDR=off", "CHESSD_DATA_DIR="+t.TempDir(), "CHESSD_SMTP_ADDR="+inbox.Addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // may be dead already
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get(base + "/v1/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return base, inbox, dbURL
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not become ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func signup(t *testing.T, base, email string) string {
	t.Helper()
	res, err := http.Post(base+"/v1/signup", "application/json", strings.NewReader(fmt.Sprintf(`{"email":%q}`, email)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct {
		APIKey string `json:"api_key"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || res.StatusCode != 201 {
		t.Fatalf("signup: %d %v", res.StatusCode, err)
	}
	return body.APIKey
}

// evalCall makes a small charged evaluation with key, outside the browser.
func evalCall(t *testing.T, base, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/eval", strings.NewReader(`{"fen":"8/8/8/4k3/8/8/3QK3/8 w - - 0 1","depth":6}`))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(res.Body) //nolint:errcheck // the status says enough
	return res.StatusCode, buf.String()
}

// browser is one Chromium tab, with what it reported: console errors and failed requests.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string

	mu       sync.Mutex
	errors   []string
	failures []string          // "METHOD path status" of requests that failed
	expected map[string]int    // failures a step provokes on purpose, by "METHOD path status"
	requests map[string]string // request id → "METHOD path"
}

func newBrowser(t *testing.T, chromium, base string) *browser {
	t.Helper()
	b := &browser{t: t, base: base, expected: map[string]int{}, requests: map[string]string{}}
	// Chromium has once exited during its own start-up on a CI machine, before it
	// opened DevTools and before any page of ours was loaded (no cause in its output).
	// Starting it is the harness, not the console: a start that fails is logged and
	// tried again with a fresh profile, and three failures in a row fail the test.
	const starts = 3
	for attempt := 1; ; attempt++ {
		ctx, release, err := startBrowser(t, chromium, b.listen)
		if err == nil {
			t.Cleanup(release)
			b.ctx = ctx
			return b
		}
		release()
		if attempt == starts {
			t.Fatalf("starting %s failed %d times; the last: %v", chromium, starts, err)
		}
		t.Logf("starting %s (attempt %d of %d): %v", chromium, attempt, starts, err)
	}
}

// startBrowser starts one headless Chromium with an empty profile. The first run
// starts the browser, which lives as long as that run's context: the returned one,
// without the per-step timeouts. release stops the browser.
func startBrowser(t *testing.T, chromium string, listen func(any)) (context.Context, func(), error) {
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithListener(listen))
	release := func() { cancel(); cancelAlloc() }
	return ctx, release, chromedp.Do(ctx)
}

// listen records what the page reports; it runs on the browser's event loop, so it
// only takes notes.
func (b *browser) listen(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			b.errors = append(b.errors, "console."+string(e.Type)+": "+strings.Join(parts, " "))
		}
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.errors = append(b.errors, "exception: "+msg)
	case *cdplog.EventEntryAdded:
		// a failed request is logged here too; requests are judged below
		if e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
			b.errors = append(b.errors, fmt.Sprintf("%s: %s %s", e.Entry.Source, e.Entry.Text, e.Entry.URL))
		}
	case *network.EventRequestWillBeSent:
		b.requests[string(e.RequestID)] = e.Request.Method + " " + pathOf(e.Request.URL)
	case *network.EventResponseReceived:
		if e.Response.Status >= 400 {
			b.failed(fmt.Sprintf("%s %d", b.requests[string(e.RequestID)], e.Response.Status))
		}
	case *network.EventLoadingFailed:
		if !e.Canceled { // a search stopped on purpose is cancelled, not failed
			b.failed(fmt.Sprintf("%s %s %s", b.requests[string(e.RequestID)], e.ErrorText, e.BlockedReason))
		}
	}
}

func (b *browser) failed(what string) {
	if b.expected[what] > 0 {
		b.expected[what]--
		return
	}
	b.failures = append(b.failures, what)
}

func pathOf(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
		if j := strings.IndexByte(u, '/'); j >= 0 {
			return u[j:]
		}
	}
	return u
}

// expectFailure lets the next request "METHOD path" answer status without failing the test.
func (b *browser) expectFailure(method, path string, status int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expected[fmt.Sprintf("%s %s %d", method, path, status)]++
}

// checkClean fails on any console error or failed request seen so far.
func (b *browser) checkClean() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.errors {
		b.t.Errorf("console error: %s", e)
	}
	for _, f := range b.failures {
		b.t.Errorf("failed request: %s", f)
	}
	for what, n := range b.expected {
		if n > 0 {
			b.t.Errorf("the expected refusal %s did not happen", what)
		}
	}
}

func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatal(err)
	}
}

func (b *browser) open(path string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base + path))
}

// eval answers a JavaScript expression's value as a string.
func (b *browser) eval(js string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.t.Fatalf("%s: %v", js, err)
	}
	return v
}

// wait waits until a JavaScript condition holds (up to two minutes: engines and jobs).
func (b *browser) wait(cond string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(2*time.Minute)))
	if err != nil {
		b.mu.Lock()
		seen := strings.Join(append(b.errors, b.failures...), "; ")
		b.mu.Unlock()
		alert, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.querySelector('.alert:not([hidden])')?.textContent || 'none'`))
		b.t.Fatalf("waiting for %s: %v (page errors so far: %s; alert: %s)", cond, err, seen, alert)
	}
}

func (b *browser) click(sel string) {
	b.t.Helper()
	b.do(chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
}

// setValue sets a control's value as typing would, with its input and change events.
func (b *browser) setValue(sel, value string) {
	b.t.Helper()
	v, _ := json.Marshal(value)
	s, _ := json.Marshal(sel)
	b.eval(fmt.Sprintf(`(() => { const el = document.querySelector(%s); el.value = %s;
		el.dispatchEvent(new Event('input', {bubbles: true})); el.dispatchEvent(new Event('change', {bubbles: true})); return ''; })()`, s, v))
}

// boardMove clicks a move's two squares on the board (White's side down).
func (b *browser) boardMove(uci string) {
	b.t.Helper()
	var rect struct{ X, Y, W, H float64 }
	if err := json.Unmarshal([]byte(b.eval(`JSON.stringify((r => ({X: r.left, Y: r.top, W: r.width, H: r.height}))(document.querySelector('cg-board').getBoundingClientRect()))`)), &rect); err != nil {
		b.t.Fatal(err)
	}
	center := func(sq string) (float64, float64) {
		file, rank := float64(sq[0]-'a'), float64(sq[1]-'1')
		return rect.X + (file+0.5)*rect.W/8, rect.Y + (7-rank+0.5)*rect.H/8
	}
	before := b.eval(`document.querySelector('[data-testid=fen]').value`)
	x1, y1 := center(uci[:2])
	x2, y2 := center(uci[2:])
	b.do(chromedp.MouseClickXY(x1, y1), chromedp.MouseClickXY(x2, y2))
	b.wait(fmt.Sprintf(`document.querySelector('[data-testid=fen]').value !== %q`, before))
}

// searchLog answers the depths the live evaluation reported, in order.
func (b *browser) searchLog() []int {
	b.t.Helper()
	var depths []int
	if err := json.Unmarshal([]byte(b.eval(`JSON.stringify([...document.querySelectorAll('[data-testid=search-log] tr')].map(r => +r.dataset.depth))`)), &depths); err != nil {
		b.t.Fatal(err)
	}
	return depths
}

// pvLine answers the first PV's moves as shown.
func (b *browser) pvLine() []string {
	b.t.Helper()
	var moves []string
	if err := json.Unmarshal([]byte(b.eval(`JSON.stringify([...document.querySelectorAll('[data-testid=pv]:first-child [data-testid=pv-move]')].map(e => e.textContent))`)), &moves); err != nil {
		b.t.Fatal(err)
	}
	return moves
}

func (b *browser) screenshot(dir, name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// tabThrough presses Tab from the first control until focus has been on every
// interactive element of the page (enabled, shown, in the tab order), and fails
// naming those it never reached.
func (b *browser) tabThrough(page string) {
	b.t.Helper()
	n := 0
	fmt.Sscan(b.eval(`String((() => {
		const els = [...document.querySelectorAll('a[href], button, input, select, textarea, summary, [tabindex]')].filter(e =>
			!e.disabled && e.tabIndex >= 0 && e.getClientRects().length > 0 &&
			!(e.type === 'radio' && !e.checked && document.querySelector('input[type=radio][name="' + e.name + '"]:checked')));
		document.querySelectorAll('[data-tab]').forEach(e => delete e.dataset.tab);
		els.forEach((e, i) => e.dataset.tab = i);
		els[0].focus();
		return els.length;
	})())`), &n)
	if n < 5 {
		b.t.Fatalf("%s: only %d controls found", page, n)
	}
	seen := map[string]bool{"0": true}
	for i := 0; i < 3*n && len(seen) < n; i++ {
		b.do(chromedp.KeyEvent(kb.Tab))
		seen[b.eval(`document.activeElement?.dataset?.tab ?? ''`)] = true
	}
	if len(seen) < n {
		missed := b.eval(fmt.Sprintf(`[...document.querySelectorAll('[data-tab]')].filter(e => !%s.includes(e.dataset.tab)).map(e => e.outerHTML.slice(0, 80)).join('\n')`, jsonList(seen)))
		b.t.Errorf("%s: Tab never reached %d of %d controls:\n%s", page, n-len(seen)+boolInt(seen[""]), n, missed)
	}
}

func jsonList(m map[string]bool) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	b, _ := json.Marshal(keys)
	return string(b)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
