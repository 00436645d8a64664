package commands_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/commands"
	"chessd/domain"
)

// ExpireTokens deletes the verification and recovery tokens used, or expired unused,
// more than the age ago (they were kept for ever, each with its address), and leaves
// the others: usable ones, and those used or expired lately. A token used long ago
// goes by its use, though it would have expired later. It works in batches (of 2
// here, so the old ones take more than one).
func TestExpireTokens(t *testing.T) {
	const age = 30 * 24 * time.Hour
	// used "" is NULL
	rows := []struct {
		name, purpose, created, expires, used string
		gone                                  bool
	}{
		{"verify, used long ago", "verify", "31 days", "30 days", "31 days", true},
		{"verify, expired unused long ago", "verify", "32 days", "31 days", "", true},
		{"recover, used long ago", "recover", "31 days", "30 days 23 hours", "31 days", true},
		{"recover, expired unused long ago", "recover", "40 days", "39 days 23 hours", "", true},
		{"verify, used long ago, expired lately", "verify", "30 days 10 hours", "29 days 10 hours", "30 days 5 hours", true},
		{"verify, used lately", "verify", "29 days", "28 days", "29 days", false},
		{"verify, expired unused lately", "verify", "30 days 12 hours", "29 days 12 hours", "", false},
		{"recover, used just now", "recover", "10 minutes", "-50 minutes", "1 minute", false},
		{"verify, usable", "verify", "1 minute", "-1439 minutes", "", false},
	}
	f := newFixture(t)
	gone := 0
	var want []string
	for i, r := range rows {
		used := "NULL"
		if r.used != "" {
			used = fmt.Sprintf("now() - interval '%s'", r.used)
		}
		if _, err := f.pool.Exec(f.ctx, fmt.Sprintf(`INSERT INTO email_verifications
			(token_hash, account_id, email, created_at, expires_at, used_at, purpose)
			VALUES ($1, 'acct_a', $2, now() - interval '%s', now() - interval '%s', %s, $3)`, r.created, r.expires, used),
			[]byte{byte(i)}, r.name, r.purpose); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if r.gone {
			gone++
		} else {
			want = append(want, r.name)
		}
	}
	commands.SetExpireBatch(t, 2)

	n, err := commands.ExpireTokens(f.ctx, f.pool, age)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := f.pool.Query(f.ctx, `SELECT email FROM email_verifications ORDER BY token_hash`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("after ExpireTokens:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if n != int64(gone) {
		t.Errorf("ExpireTokens answered %d tokens deleted, want %d", n, gone)
	}
	if n, err := commands.ExpireTokens(f.ctx, f.pool, age); err != nil || n != 0 {
		t.Errorf("ExpireTokens again: %d deleted (%v), want none", n, err)
	}
}

// The limits on messages with a token (one a minute, five a day) still hold after a
// sweep with the least age it documents (a day): it leaves every token they count,
// here five made 23 hours ago and expired 22 hours ago (a sweep by a younger age, or
// by expiry alone, would take them and let a sixth message go).
func TestExpireTokensKeepsTheLimits(t *testing.T) {
	f := newFixture(t)
	res, err := f.h.Signup(f.ctx, domain.Signup{Email: "limits@example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx, `INSERT INTO email_verifications (token_hash, account_id, email, expires_at)
		SELECT decode(md5(i::text), 'hex'), account_id, email, expires_at
		  FROM email_verifications, generate_series(1, 4) AS i WHERE account_id = $1`, res.AccountID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx, `UPDATE email_verifications SET created_at = now() - interval '23 hours',
		expires_at = now() - interval '22 hours' WHERE account_id = $1`, res.AccountID); err != nil {
		t.Fatal(err)
	}
	if _, err := commands.ExpireTokens(f.ctx, f.pool, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	var full *commands.MailsFull
	if err := f.h.ResendVerification(f.ctx, commands.Actor{Key: f.key(res.KeyID)}); !errors.As(err, &full) {
		t.Errorf("a sixth message within a day, past a sweep: %v, want refused (MailsFull)", err)
	}
}

// ExpireTokens finds the old tokens by an index, not a scan of the table.
// (enable_seqscan off: an empty test table would be scanned anyway; a scan then shows
// only for want of an index.)
func TestExpireTokensUsesAnIndex(t *testing.T) {
	f := newFixture(t)
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // only explained
	if _, err := tx.Exec(f.ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	stmt, args := commands.ExpireTokensStatement(30 * 24 * time.Hour)
	rows, err := tx.Query(f.ctx, "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "email_verifications_ended") {
		t.Errorf("ExpireTokens does not find the old tokens by their index:\n%s", plan)
	}
}
