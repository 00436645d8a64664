package mail_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/mail"
	"chessd/mail/mailtest"
	"chessd/postgres/pgtest"
)

// Expire deletes the messages sent, or given up, more than the age ago, and clears the
// bodies of those given up since; it leaves pending messages, however overdue, a last
// try under way, and what an older server queued (no due_at), which its sender takes
// over first. It works in batches (of 2 here, so each kind takes more than one).
func TestExpire(t *testing.T) {
	const age = 30 * 24 * time.Hour
	const (
		old   = "now() - interval '31 days'"
		young = "now() - interval '29 days'"
	)
	// body: what the row holds; after: what it holds after Expire, "gone" when deleted.
	// due "" is NULL (an older server's row, scheduled by next); sent "" is NULL.
	rows := []struct {
		name, created, sent, due, next string
		attempts                       int
		body, after                    string
	}{
		{"sent long ago", old, old, old, "", 1, "", "gone"},
		{"sent long ago, 2", old, old, old, "", 1, "", "gone"},
		{"sent long ago, 3", old, old, old, "", 3, "", "gone"},
		{"sent lately", young, young, young, "", 1, "", ""},
		{"sent just now", "now()", "now()", "now()", "", 1, "", ""},
		{"sent long ago by an older server", old, old, "", old, 1, "in the clear", "gone"},
		{"sent lately by an older server", young, young, "", young, 1, "in the clear", "in the clear"}, // clearSent's, not Expire's
		{"given up long ago", old, "", old, "", mail.MaxAttempts, "", "gone"},
		{"given up long ago, its body kept", old, "", old, "", mail.MaxAttempts, "sealed", "gone"},
		{"given up lately, its body kept", old, "", young, "", mail.MaxAttempts, "sealed", ""},
		{"given up just now, its last claim lapsed", "now()", "", "now() - interval '1 second'", "", mail.MaxAttempts, "sealed", ""},
		{"last try under way", "now()", "", "now() + interval '2 minutes'", "", mail.MaxAttempts, "sealed", "sealed"},
		{"pending, overdue for long", old, "", old, "", mail.MaxAttempts - 1, "sealed", "sealed"},
		{"pending, due", "now()", "", "now()", "", 0, "sealed", "sealed"},
		{"pending, retried later", "now()", "", "now() + interval '1 hour'", "", 2, "sealed", "sealed"},
		{"ended by 0045 long ago", "now() - interval '40 days'", "", "'infinity'", "", 2, "", "gone"},
		{"ended by 0045 lately", young, "", "'infinity'", "", 2, "", ""},
		{"an older server's, given up long ago", old, "", "", old, mail.MaxAttempts, "in the clear", "in the clear"},
		{"an older server's, pending", old, "", "", "now()", 0, "in the clear", "in the clear"},
	}
	pool := pgtest.NewDB(t)
	bg := context.Background()
	gone := 0
	var want []string
	for _, r := range rows {
		sent, due, next := "NULL", "NULL", "'infinity'"
		if r.sent != "" {
			sent = r.sent
		}
		if r.due != "" {
			due = r.due
		} else {
			next = r.next
		}
		if _, err := pool.Exec(bg, fmt.Sprintf(`INSERT INTO mail_outbox
			(account_id, to_email, subject, body, created_at, sent_at, due_at, next_attempt_at, attempts)
			VALUES ('acct_a', 'a@example.com', $1, $2, %s, %s, %s, %s, $3)`, r.created, sent, due, next),
			r.name, r.body, r.attempts); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if r.after == "gone" {
			gone++
		} else {
			want = append(want, fmt.Sprintf("%s [%s]", r.name, r.after))
		}
	}
	mail.SetExpireBatch(t, 2)

	n, err := mail.Expire(bg, pool, age)
	if err != nil {
		t.Fatal(err)
	}
	got := outbox(t, pool)
	if !slices.Equal(got, want) {
		t.Errorf("after Expire:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if n != int64(gone) {
		t.Errorf("Expire answered %d rows deleted, want %d", n, gone)
	}
	if n, err := mail.Expire(bg, pool, age); err != nil || n != 0 {
		t.Errorf("Expire again: %d deleted (%v), want none", n, err)
	}
	if got := outbox(t, pool); !slices.Equal(got, want) {
		t.Errorf("after Expire again:\n  %s", strings.Join(got, "\n  "))
	}
}

// outbox answers each mail_outbox row as "subject [body]".
func outbox(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	t.Helper()
	rows, err := q.Query(context.Background(), `SELECT subject || ' [' || body || ']' FROM mail_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A message's last failed try gives it up: its body is cleared then, and its due_at
// says when, so Expire deletes it once that is older than the age; a try before the
// last keeps the body, for the next.
func TestLastFailedTryGivesUp(t *testing.T) {
	pool := pgtest.NewDB(t)
	bg := context.Background()
	in := mailtest.Start(t, mailtest.Config{Failures: 100})
	queue(t, pool, 2)
	// user0 has its last try but one left, user1 its last
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET attempts = $1 - 2 + (to_email = 'user1@example.com')::int`, mail.MaxAttempts); err != nil {
		t.Fatal(err)
	}
	s := mail.NewSender(mail.Config{SMTPAddr: in.Addr, Seal: sealer(t)}, pool, slog.New(slog.DiscardHandler))
	if n := s.SendDue(bg) + s.SendDue(bg); n != 2 {
		t.Fatalf("%d messages tried, want 2", n)
	}
	if got := len(in.Messages()); got != 0 {
		t.Fatalf("%d messages arrived, want none (the server refuses them)", got)
	}
	rows, err := pool.Query(bg, `SELECT to_email || ' ' || attempts || ' ' || (body <> '') || ' ' || (due_at <= now()) || ' ' || (last_error IS NOT NULL)
		FROM mail_outbox ORDER BY to_email`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	// to_email attempts body-kept given-up-by-now error-kept
	want := []string{
		fmt.Sprintf("user0@example.com %d true false true", mail.MaxAttempts-1),
		fmt.Sprintf("user1@example.com %d false true true", mail.MaxAttempts),
	}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("after the tries: %q (%v), want %q", got, err, want)
	}
	if n := s.SendDue(bg); n != 0 {
		t.Fatalf("a message given up, or waiting for its retry, was tried again")
	}

	// two hours on, with an age of one: the message given up goes, the other stays
	if _, err := pool.Exec(bg, `UPDATE mail_outbox SET due_at = due_at - interval '2 hours', created_at = created_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if n, err := mail.Expire(bg, pool, time.Hour); err != nil || n != 1 {
		t.Fatalf("Expire: %d deleted (%v), want 1", n, err)
	}
	var left string
	if err := pool.QueryRow(bg, `SELECT string_agg(to_email, ',') FROM mail_outbox`).Scan(&left); err != nil || left != "user0@example.com" {
		t.Fatalf("left %q (%v), want user0's message", left, err)
	}
}

// Each of Expire's statements finds its rows by an index, not a scan of the outbox,
// which holds every message sent within the age.
func TestExpireUsesIndexes(t *testing.T) {
	pool := pgtest.NewDB(t)
	stmts, args := mail.ExpireStatements(30 * 24 * time.Hour)
	for i, stmt := range stmts {
		plan := explain(t, pool, stmt, args[i]...)
		if strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s\nscans the table:\n%s", stmt, plan)
		}
	}
}

// explain answers stmt's plan where the planner scans a table only for want of an
// index (enable_seqscan off): an empty test table would be scanned anyway.
func explain(t *testing.T, pool *pgxpool.Pool, stmt string, args ...any) string {
	t.Helper()
	bg := context.Background()
	tx, err := pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg) //nolint:errcheck // only explained
	if _, err := tx.Exec(bg, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(bg, "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
