package commands_test

import (
	"errors"
	"testing"
	"time"

	"chessd/commands"
	"chessd/domain"
)

// A change of a job's key, or of its account's budget, that commits while a record of
// the job is checking the key charges nothing after it: the record waits for the
// change and fails the job. The change is held between its event and its budget row
// (the row locked elsewhere, as a concurrent settle holds it), and the record starts
// meanwhile: it read the key's old version, passed, waited on the balance row behind
// the change and charged after it (spend past the lowered budget, a charge after
// KeyRevoked).
func TestRecordWaitsForAKeyChangeCommitting(t *testing.T) {
	one := int64(1)
	for _, c := range []struct {
		name    string
		blocker string // the row the change waits on, after its event
		change  func(f *fixture, actor commands.Actor, key *domain.Key) error
		code    domain.Code
	}{
		{"revoked", `SELECT 1 FROM key_balances WHERE key_id = $1 FOR UPDATE`, func(f *fixture, actor commands.Actor, key *domain.Key) error {
			_, err := f.h.RevokeKey(f.ctx, actor, key.ID())
			return err
		}, domain.CodeBadCredential},
		{"key budget lowered", `SELECT 1 FROM key_balances WHERE key_id = $1 FOR UPDATE`, func(f *fixture, actor commands.Actor, key *domain.Key) error {
			_, err := f.h.UpdateKey(f.ctx, actor, key.ID(), domain.KeyChange{Budget: domain.BudgetChange{Units: &one}})
			return err
		}, domain.CodeBudget},
		{"account budget lowered", `SELECT 1 FROM account_budgets b JOIN key_balances k USING (account_id, env) WHERE k.key_id = $1 FOR UPDATE OF b`,
			func(f *fixture, actor commands.Actor, key *domain.Key) error {
				_, err := f.h.UpdateAccount(f.ctx, actor, commands.AccountChange{Budget: &domain.BudgetChange{Units: &one}})
				return err
			}, domain.CodeBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			j, key := f.job(4)
			f.take("w1", 4, time.Minute)
			if _, _, err := f.h.StartJob(f.ctx, j.ID(), "w1", false); err != nil {
				t.Fatal(err)
			}
			blocker, err := f.pool.Begin(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback(f.ctx) //nolint:errcheck // rolled back below
			if tag, err := blocker.Exec(f.ctx, c.blocker, key.ID()); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("lock the budget row: %v (%d rows)", err, tag.RowsAffected())
			}
			changed := make(chan error, 1)
			go func() { changed <- c.change(f, commands.Actor{Key: key, RequestID: "r"}, key) }()
			f.waitLocked(1)
			recorded := make(chan error, 1)
			go func() {
				_, err := f.h.RecordPositions(f.ctx, key, j.ID(), "w1", []commands.Position{position(t, j, 0)})
				recorded <- err
			}()
			f.waitLocked(2)
			if err := blocker.Rollback(f.ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-changed; err != nil {
				t.Fatalf("the change: %v", err)
			}
			if err := <-recorded; !errors.Is(err, commands.ErrNotClaimable) {
				t.Fatalf("the record after the change: %v, want the job stopped", err)
			}
			if n := f.events(j.ID(), "JobPositionAnalysed"); n != 0 {
				t.Fatalf("%d positions recorded after the change", n)
			}
			if n := f.count(`SELECT count(*) FROM events WHERE stream_id = 'ledger-' || $1 AND event_type = 'UnitsCharged'`, key.ID()); n != 0 {
				t.Fatalf("%d charges after the change", n)
			}
			var code string
			if err := f.pool.QueryRow(f.ctx, `SELECT payload->>'code' FROM events WHERE stream_id = $1 AND event_type = 'JobFailed'`,
				domain.JobStream(j.ID())).Scan(&code); err != nil || code != string(c.code) {
				t.Fatalf("the job's failure: %q (%v), want %s", code, err, c.code)
			}
		})
	}
}

// waitLocked waits until n of the database's sessions wait for a lock.
func (f *fixture) waitLocked(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) < n {
		if time.Now().After(deadline) {
			f.t.Fatalf("fewer than %d sessions wait for a lock after 10 s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
