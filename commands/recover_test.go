package commands_test

import (
	"regexp"
	"testing"

	"chessd/commands"
	"chessd/domain"
)

// A key made while a recovery revokes every key of the account is refused, not made
// beside them: the creation reads its acting key only once it holds the account's keys
// lock, which the recovery holds until it commits. (It read the key before waiting for
// the lock, saw it active, and made a key with every scope that survived the takeover.)
func TestKeyMadeDuringATakeoverIsRefused(t *testing.T) {
	f := newFixture(t)
	res, err := f.h.Signup(f.ctx, domain.Signup{Email: "race@example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx, `UPDATE email_verifications SET created_at = created_at - interval '61 seconds'`); err != nil {
		t.Fatal(err)
	}
	if err := f.h.RequestRecovery(f.ctx, "race@example.com"); err != nil {
		t.Fatal(err)
	}
	seal, err := commands.NewMailSealer(pepper)
	if err != nil {
		t.Fatal(err)
	}
	var sealed string
	if err := f.pool.QueryRow(f.ctx, `SELECT body FROM mail_outbox WHERE subject LIKE 'A new API key%'`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	body, err := seal.Open(sealed, "race@example.com")
	if err != nil {
		t.Fatal(err)
	}
	token := regexp.MustCompile(`rk_[0-9A-Za-z]+`).FindString(body)

	// the account's keys lock held here, so that the recovery and then the creation
	// queue behind it, in that order
	blocker, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(f.ctx) //nolint:errcheck // released below
	if _, err := blocker.Exec(f.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "keys-of-"+res.AccountID); err != nil {
		t.Fatal(err)
	}
	recovered := make(chan error, 1)
	go func() {
		_, err := f.h.RecoverKey(f.ctx, token, true, nil, "req-2")
		recovered <- err
	}()
	f.waitLocked(1)
	created := make(chan error, 1)
	go func() {
		_, _, err := f.h.CreateKey(f.ctx, commands.Actor{Key: f.key(res.KeyID), RequestID: "req-3"},
			domain.KeySettings{Scopes: domain.AllScopes, Env: domain.EnvLive})
		created <- err
	}()
	f.waitLocked(2)
	if err := blocker.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-recovered; err != nil {
		t.Fatalf("the recovery: %v", err)
	}
	wantCode(t, "a key made with a key the recovery revoked", <-created, domain.CodeBadCredential)
	if n := f.count(`SELECT count(*) FROM key_balances WHERE account_id = $1 AND revoked_at IS NULL`, res.AccountID); n != 1 {
		t.Fatalf("%d active keys after the takeover, want the recovered one alone", n)
	}
}
