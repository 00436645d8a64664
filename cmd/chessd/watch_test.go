package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"chessd/domain"
	"chessd/postgres/pgtest"
)

// request sends one JSON request to srv and returns its status and decoded body.
func (s *server) request(t *testing.T, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	var out map[string]any
	json.NewDecoder(res.Body).Decode(&out) //nolint:errcheck // 204 has no body
	return res.StatusCode, out
}

// Two `chessd serve` processes on one database answer a key's calls from memory, and
// a change made through one is refused by the other on its very next call. When one of
// them is killed (its lease row left behind), a change through the other waits for that
// row to run out, and no longer.
func TestKeyChangesReachEveryServerProcess(t *testing.T) {
	bin := buildBinary(t)
	dbURL := pgtest.URL(t)
	pool, su := account(t, dbURL, "watchers@example.com", domain.PlanPro)
	a := startServer(t, bin, dbURL, freePort(t))
	b := startServer(t, bin, dbURL, freePort(t))
	ctx := context.Background()
	valid := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM stream_watchers WHERE valid_until > now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "both servers watch", time.Minute, func() bool { return valid() == 2 })
	eval := `{"fen":"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1","depth":2}`
	newKey := func(label string) (secret, id string) {
		status, body := a.request(t, "POST", "/keys", su.Secret, `{"label":"`+label+`","scopes":["eval"]}`)
		if status != 201 {
			t.Fatalf("create key: %d %v", status, body)
		}
		return body["api_key"].(string), body["key_id"].(string)
	}
	tests := []struct {
		name   string
		change func(id string) int
		want   int
	}{
		{"revoked through the other server", func(id string) int { s, _ := a.request(t, "DELETE", "/keys/"+id, su.Secret, ""); return s }, 401},
		{"scope removed through the other server", func(id string) int {
			s, _ := a.request(t, "PATCH", "/keys/"+id, su.Secret, `{"scopes":["usage:read"]}`)
			return s
		}, 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secret, id := newKey(tt.name)
			for range 3 { // the first call loads the key, the others answer from memory
				if status, body := b.request(t, "POST", "/eval", secret, eval); status != 200 {
					t.Fatalf("eval before the change: %d %v", status, body)
				}
			}
			if status := tt.change(id); status/100 != 2 {
				t.Fatalf("change: %d", status)
			}
			if status, body := b.request(t, "POST", "/eval", secret, eval); status != tt.want {
				t.Fatalf("the other server's next call: %d %v, want %d", status, body, tt.want)
			}
		})
	}

	// b dies without deleting its row: a change through a waits for it to run out
	secret, id := newKey("after a kill")
	if status, _ := b.request(t, "POST", "/eval", secret, eval); status != 200 {
		t.Fatalf("eval: %d", status)
	}
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.cmd.Wait() //nolint:errcheck // killed
	if valid() != 2 {
		t.Fatal("the killed server's row expired before the change: the test proves nothing")
	}
	if status, _ := a.request(t, "DELETE", "/keys/"+id, su.Secret, ""); status != 204 {
		t.Fatalf("revoke: %d", status)
	}
	if n := valid(); n != 1 {
		t.Fatalf("the revocation returned while %d watchers could still vouch for their memory, want only the live server's", n)
	}
	if status, _ := a.request(t, "POST", "/eval", secret, eval); status != 401 {
		t.Fatalf("the live server's next call: %d, want 401", status)
	}
}
