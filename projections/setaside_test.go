package projections_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// appendRaw appends events below the command layer: payloads no command would write.
func appendRaw(t *testing.T, pool *pgxpool.Pool, stream, streamType string, expected int64, evs ...domain.Event) []eventstore.Event {
	t.Helper()
	var news []eventstore.New
	for _, e := range evs {
		news = append(news, eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e})
	}
	out, err := eventstore.NewStore(pool, quiet).Transact(context.Background(), func(ctx context.Context, tx *eventstore.Tx) error {
		return tx.Append(ctx, stream, streamType, expected, eventstore.Metadata{RequestID: "test"}, news...)
	})
	if err != nil {
		t.Fatalf("append to %s: %v", stream, err)
	}
	return out
}

// runProjections runs the projections until the test ends.
func runProjections(t *testing.T, pool *pgxpool.Pool, ps ...projections.Projection) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() { done <- projections.NewRunner(pool, quiet, ps...).Run(ctx, ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("projections did not start: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// caughtUp: the projection's checkpoint has reached the head of the log.
func caughtUp(t *testing.T, pool *pgxpool.Pool, name string) func() bool {
	return func() bool {
		return count(t, pool, `SELECT count(*) FROM projection_checkpoints c, event_chain h WHERE c.name = $1 AND c.position >= h.position`, name) == 1
	}
}

func snapshot(t *testing.T, pool *pgxpool.Pool, tables []string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, table := range tables {
		out[table] = column(t, pool, `SELECT x::text FROM `+pgx.Identifier{table}.Sanitize()+` x ORDER BY 1`)
	}
	return out
}

func setAsideAt(t *testing.T, list []projections.SetAsideEvent, position int64) projections.SetAsideEvent {
	t.Helper()
	for _, s := range list {
		if s.Position == position {
			return s
		}
	}
	t.Fatalf("position %d is not set aside: %+v", position, list)
	return projections.SetAsideEvent{}
}

// Events the accounts projection cannot apply (a NUL in a name or a label, which
// PostgreSQL refuses in text; a row a constraint refuses) are set aside with their
// error; the events of their streams after them wait behind them; every other stream
// goes on. A rebuild gives the same read model and the same set-aside events, the
// chain stays intact, and an operator's retry and skip release what was held.
func TestAccountsProjectionSetsAsideWhatItCannotApply(t *testing.T) {
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	h := commands.New(eventstore.NewStore(pool, quiet), []byte("pepper-for-the-set-aside-test"))
	signup := func(email, name string) commands.SignupResult {
		t.Helper()
		res, err := h.Signup(ctx, domain.Signup{Email: email, Name: name}, "req")
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	before := signup("before@example.com", "")

	// Poisoned events, appended through the event store.
	now := time.Now().UTC().Truncate(time.Microsecond)
	badAccount := appendRaw(t, pool, domain.AccountStream("acct_nul"), domain.StreamAccount, 0,
		&domain.AccountCreated{AccountID: "acct_nul", Email: "nul@example.com", Name: "Nul\x00Name", Plan: "free", CreatedAt: now})[0]
	if err := h.ChangePlan(ctx, "acct_nul", domain.PlanPro, "held behind the bad creation"); err != nil {
		t.Fatal(err)
	}
	heldPlan := count(t, pool, `SELECT position FROM events WHERE stream_id = 'account-acct_nul' AND version = 2`)
	// A NUL in a key's label never gets this far: the events table's index on
	// KeyCreated's secret_hash makes PostgreSQL decode the whole payload, and the
	// append fails (22P05), leaving the log as it was.
	_, err := eventstore.NewStore(pool, quiet).Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		return tx.Append(ctx, domain.KeyStream("key_nul"), domain.StreamKey, 0, eventstore.Metadata{}, eventstore.New{Type: "KeyCreated",
			Payload: &domain.KeyCreated{KeyID: "key_nul", AccountID: before.AccountID, Label: "label\x00", Env: "live", SecretHash: "ab"}})
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P05" {
		t.Fatalf("appending a KeyCreated with a NUL in its label: %v", err)
	}
	// A budget over what the read model's numeric(20, 6) holds does get in.
	huge := decimal.RequireFromString("1e30")
	badKey := appendRaw(t, pool, domain.KeyStream("key_huge"), domain.StreamKey, 0,
		&domain.KeyCreated{KeyID: "key_huge", AccountID: before.AccountID, Label: "huge", Scopes: domain.AllScopes,
			Env: "live", BudgetUSD: &huge, Prefix: "ce_live_huge", SecretHash: strings.Repeat("ab", 32), CreatedAt: now})[0]
	// A row the read model's own constraint refuses, until an operator lifts it.
	for _, q := range []string{
		`ALTER TABLE accounts ADD CONSTRAINT no_forbidden CHECK (name <> 'Forbidden')`,
		`ALTER TABLE accounts ADD CONSTRAINT no_banned CHECK (name <> 'Banned')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	refused := signup("refused@example.com", "Forbidden")
	if err := h.ChangePlan(ctx, refused.AccountID, domain.PlanHobby, "held behind the refused creation"); err != nil {
		t.Fatal(err)
	}
	banned := signup("banned@example.com", "Banned")
	after := signup("after@example.com", "")

	runProjections(t, pool, projections.Accounts{})
	pgtest.WaitFor(t, "the projection to reach the head", caughtUp(t, pool, "accounts_v1"))
	for _, acct := range []string{before.AccountID, after.AccountID} {
		if count(t, pool, `SELECT count(*) FROM accounts WHERE account_id = $1`, acct) != 1 {
			t.Fatalf("account %s, a good stream, is missing", acct)
		}
	}
	if count(t, pool, `SELECT count(*) FROM api_keys WHERE key_id = $1`, after.KeyID) != 1 {
		t.Fatal("the key created after the poisoned events is missing")
	}
	if count(t, pool, `SELECT count(*) FROM accounts WHERE account_id IN ('acct_nul', $1)`, refused.AccountID) != 0 ||
		count(t, pool, `SELECT count(*) FROM api_keys WHERE key_id = 'key_huge'`) != 0 {
		t.Fatal("a set-aside event reached the read model")
	}
	refusedPos := int64(count(t, pool, `SELECT position FROM events WHERE stream_id = $1 AND version = 1`, domain.AccountStream(refused.AccountID)))
	refusedPlan := int64(count(t, pool, `SELECT position FROM events WHERE stream_id = $1 AND version = 2`, domain.AccountStream(refused.AccountID)))
	bannedPos := int64(count(t, pool, `SELECT position FROM events WHERE stream_id = $1`, domain.AccountStream(banned.AccountID)))

	list, err := projections.ListSetAside(ctx, pool, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 6 {
		t.Fatalf("%d events set aside, want 6: %+v", len(list), list)
	}
	for _, c := range []struct {
		position int64
		heldBy   int64
		err      string
	}{
		{badAccount.Position, 0, "0x00"},
		{int64(heldPlan), badAccount.Position, "held"},
		{badKey.Position, 0, "22003"},
		{refusedPos, 0, "no_forbidden"},
		{refusedPlan, refusedPos, "held"},
		{bannedPos, 0, "no_banned"},
	} {
		s := setAsideAt(t, list, c.position)
		if s.State != "open" || s.Projection != "accounts_v1" || !strings.Contains(s.Error, c.err) ||
			(c.heldBy == 0) != (s.HeldBy == nil) || (s.HeldBy != nil && *s.HeldBy != c.heldBy) {
			t.Errorf("position %d: %+v (held by %v), want error with %q held by %d", c.position, s, s.HeldBy, c.err, c.heldBy)
		}
	}

	// A rebuild comes to the same read model and the same set-aside events.
	live := snapshot(t, pool, projections.Accounts{}.Tables())
	rep, err := projections.Rebuild(ctx, pool, projections.Accounts{})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if rep.SetAside != 6 || rep.Applied != int64(count(t, pool, `SELECT count(*) FROM events`))-6 {
		t.Fatalf("rebuild report %+v", rep)
	}
	if rebuilt := snapshot(t, pool, projections.Accounts{}.Tables()); !reflect.DeepEqual(live, rebuilt) {
		t.Fatalf("rebuilt read model differs:\nlive    %v\nrebuilt %v", live, rebuilt)
	}
	if again, _ := projections.ListSetAside(ctx, pool, false); len(again) != 6 || setAsideAt(t, again, badKey.Position).Attempts != 2 {
		t.Fatalf("after the rebuild: %+v", again)
	}
	if rep, err := eventstore.Verify(ctx, pool); err != nil || rep.Tamper != nil {
		t.Fatalf("verify: %v %v", err, rep.Tamper)
	}

	ps := projections.All()
	id := func(pos int64) int64 { return setAsideAt(t, list, pos).ID }
	// Retrying without a fix fails again, and says so.
	res, err := projections.RetrySetAside(ctx, pool, ps, id(refusedPos), "ops@test", "")
	if err != nil || res.FailedAt != refusedPos || len(res.Applied) != 0 {
		t.Fatalf("retry before the fix: %+v %v", res, err)
	}
	// The fix: the constraint goes; the retry applies the event and the one held behind it.
	if _, err := pool.Exec(ctx, `ALTER TABLE accounts DROP CONSTRAINT no_forbidden`); err != nil {
		t.Fatal(err)
	}
	// The held event is not retried ahead of the one it waits behind: that applied both
	// and left the first listed open, for a skip to make a rebuild differ.
	if _, err := projections.RetrySetAside(ctx, pool, ps, id(refusedPlan), "ops@test", "the plan change first"); domain.ErrorCode(err) != domain.CodeConflict {
		t.Fatalf("retry of the held event before its blocker: %v, want 409", err)
	}
	res, err = projections.RetrySetAside(ctx, pool, ps, id(refusedPos), "ops@test", "constraint dropped")
	if err != nil || !reflect.DeepEqual(res.Applied, []int64{refusedPos, refusedPlan}) || res.FailedAt != 0 {
		t.Fatalf("retry after the fix: %+v %v", res, err)
	}
	if count(t, pool, `SELECT count(*) FROM accounts WHERE account_id = $1 AND plan = 'hobby' AND version = 2`, refused.AccountID) != 1 {
		t.Fatal("the retried account is not in the read model at its latest version")
	}
	// Skipping the NUL account releases the plan change held behind it.
	if _, err := projections.SkipSetAside(ctx, pool, ps, id(badAccount.Position), "ops@test", ""); err == nil {
		t.Fatal("a skip without a reason was accepted")
	}
	res, err = projections.SkipSetAside(ctx, pool, ps, id(badAccount.Position), "ops@test", "test data")
	if err != nil || !reflect.DeepEqual(res.Applied, []int64{int64(heldPlan)}) {
		t.Fatalf("skip: %+v %v", res, err)
	}
	if _, err := projections.RetrySetAside(ctx, pool, ps, id(badAccount.Position), "ops@test", ""); domain.ErrorCode(err) != domain.CodeConflict {
		t.Fatalf("retrying a skipped event: %v", err)
	}
	open, _ := projections.ListSetAside(ctx, pool, false)
	if len(open) != 2 || open[0].Position != badKey.Position || open[1].Position != bannedPos {
		t.Fatalf("open after retry and skip: %+v", open)
	}
	var actions []string
	rows, _ := pool.Query(ctx, `SELECT s.position || ' ' || a.action || ' ' || split_part(a.outcome, ':', 1) || ' ' || a.actor
		FROM set_aside_actions a JOIN set_aside_events s ON s.id = a.set_aside_id ORDER BY a.id`)
	actions, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("%d retry failed ops@test", refusedPos),
		fmt.Sprintf("%d retry applied ops@test", refusedPos),
		fmt.Sprintf("%d retry applied ops@test", refusedPlan),
		fmt.Sprintf("%d skip skipped ops@test", badAccount.Position),
		fmt.Sprintf("%d retry applied ops@test", heldPlan),
	}
	if !reflect.DeepEqual(actions, want) {
		t.Fatalf("recorded actions:\n%v\nwant\n%v", strings.Join(actions, "\n"), strings.Join(want, "\n"))
	}

	// A rebuild after a fix applies what the fix allows and marks it so; it leaves the
	// skipped event out and applies the rest as the operator did.
	if _, err := pool.Exec(ctx, `ALTER TABLE accounts DROP CONSTRAINT no_banned`); err != nil {
		t.Fatal(err)
	}
	rep, err = projections.Rebuild(ctx, pool, projections.Accounts{})
	if err != nil || rep.SetAside != 1 || rep.Skipped != 1 {
		t.Fatalf("rebuild after the operator: %+v %v", rep, err)
	}
	all, _ := projections.ListSetAside(ctx, pool, true)
	if s := setAsideAt(t, all, bannedPos); s.State != "retried" || s.LastAction == nil || s.LastAction.Action != "rebuild" ||
		count(t, pool, `SELECT count(*) FROM accounts WHERE account_id = $1`, banned.AccountID) != 1 {
		t.Fatalf("the event the fix allows, after the rebuild: %+v %+v", s, s.LastAction)
	}
	live = snapshot(t, pool, projections.Accounts{}.Tables())
	if rep, err := projections.Rebuild(ctx, pool, projections.Accounts{}); err != nil || rep.SetAside != 1 || rep.Skipped != 1 {
		t.Fatalf("rebuild again: %+v %v", rep, err)
	}
	if rebuilt := snapshot(t, pool, projections.Accounts{}.Tables()); !reflect.DeepEqual(live, rebuilt) {
		t.Fatalf("rebuilt read model differs:\nlive    %v\nrebuilt %v", live, rebuilt)
	}
	if rep, err := eventstore.Verify(ctx, pool); err != nil || rep.Tamper != nil {
		t.Fatalf("verify: %v %v", err, rep.Tamper)
	}
}

// A failure that will pass (here a lock wait running out while another transaction
// holds the accounts table) sets nothing aside: the batch rolls back and runs again,
// and the event is applied once the lock is gone.
func TestTransientFailureIsNotSetAside(t *testing.T) {
	rawURL := pgtest.URL(t)
	pool := pgtest.NewDBAt(t, rawURL)
	ctx := context.Background()
	h := commands.New(eventstore.NewStore(pool, quiet), []byte("pepper-for-the-transient-test"))
	res, err := h.Signup(ctx, domain.Signup{Email: "locked@example.com"}, "req")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(rawURL)
	q := u.Query()
	q.Set("options", "-c lock_timeout=100ms")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	projPool := pgtest.NewDBAt(t, u.String())
	runProjections(t, projPool, projections.Accounts{})
	pgtest.WaitFor(t, "the account to be projected", caughtUp(t, pool, "accounts_v1"))

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // released below
	// A table lock rather than a row lock: a row lock takes a transaction id, and the
	// bus delivers nothing committed after the oldest open transaction id.
	if _, err := tx.Exec(ctx, `LOCK TABLE accounts IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	rollbacks := rolledBack(t, pool)
	if err := h.ChangePlan(ctx, res.AccountID, domain.PlanPro, "test"); err != nil {
		t.Fatal(err)
	}
	// The projection's lock wait runs out and its transaction rolls back.
	pgtest.WaitFor(t, "a lock wait to run out", func() bool {
		return rolledBack(t, pool) > rollbacks || count(t, pool, `SELECT count(*) FROM set_aside_events`) > 0
	})
	if n := count(t, pool, `SELECT count(*) FROM set_aside_events`); n != 0 {
		t.Fatalf("a lock timeout set %d events aside", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, "the plan change to be projected", func() bool {
		return count(t, pool, `SELECT count(*) FROM accounts WHERE account_id = $1 AND plan = 'pro'`, res.AccountID) == 1
	})
	if n := count(t, pool, `SELECT count(*) FROM set_aside_events`); n != 0 {
		t.Fatalf("%d events set aside", n)
	}
}

// rolledBack counts the database's rolled-back transactions.
func rolledBack(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCannotApply(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"NUL in text", &pgconn.PgError{Code: "22021"}, true},
		{"unsupported unicode escape", &pgconn.PgError{Code: "22P05"}, true},
		{"check constraint", &pgconn.PgError{Code: "23514"}, true},
		{"index row too large", &pgconn.PgError{Code: "54000"}, true},
		{"wrapped data error", fmt.Errorf("position 3: %w", &pgconn.PgError{Code: "22001"}), true},
		{"undecodable payload", errors.New("decode AccountCreated: invalid character"), true},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, false},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, false},
		{"lock timeout", &pgconn.PgError{Code: "55P03"}, false},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, false},
		{"undefined table (a bug, not the event)", &pgconn.PgError{Code: "42P01"}, false},
		{"cancelled", fmt.Errorf("query: %w", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, false},
		{"connection lost", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := projections.CannotApply(c.err); got != c.want {
				t.Fatalf("CannotApply(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
