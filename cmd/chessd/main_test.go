package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// runCLI runs a subcommand against the database at url and returns what it printed.
func runCLI(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "LOG_LEVEL": "error", "CHESSD_DATA_DIR": t.TempDir()}
	runErr := run(context.Background(), args, func(k string) string { return env[k] }, out)
	b, _ := os.ReadFile(out.Name())
	return string(b), runErr
}

func TestVerifyAndRebuildCommands(t *testing.T) {
	url := pgtest.URL(t)
	if _, err := runCLI(t, url, "migrate"); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.NewDBAt(t, url)
	h := commands.New(eventstore.NewStore(pool, nil), []byte("pepper-for-the-cli-test"))
	ctx := context.Background()
	for _, email := range []string{"a@example.com", "b@example.com"} {
		if _, err := h.Signup(ctx, domain.Signup{Email: email}, "req"); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCLI(t, url, "verify")
	if err != nil || !strings.Contains(out, "ok: 6 events") {
		t.Fatalf("verify on an intact log: %v %q", err, out)
	}
	out, err = runCLI(t, url, "rebuild")
	if err != nil || !strings.Contains(out, "rebuilt accounts_v1 from 6 events") {
		t.Fatalf("rebuild: %v %q", err, out)
	}
	var keys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&keys); err != nil || keys != 2 {
		t.Fatalf("after rebuild api_keys has %d rows (%v)", keys, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE events SET payload = '{"account_id":"acct_evil"}' WHERE position = 4`); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, url, "verify")
	if err == nil || !strings.Contains(out, "position 4 edited") {
		t.Fatalf("verify after an edit: %v %q", err, out)
	}
}
