package commands_test

import (
	"sync"
	"testing"

	"chessd/commands"
	"chessd/domain"
)

// Concurrent requests for a new verification message queue one: the others are told a
// message went out less than a minute ago (rate_limited), as when they come one after another.
func TestResendVerificationQueuesOneAtOnce(t *testing.T) {
	f := newFixture(t)
	res, err := f.h.Signup(f.ctx, domain.Signup{Email: "resend@example.com"}, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	actor := commands.Actor{Key: f.key(res.KeyID)}
	for round := range 5 {
		// the messages went out over a day ago: neither the minute's limit nor the
		// day's (MaxVerificationMails) holds the next one back
		if _, err := f.pool.Exec(f.ctx, `UPDATE email_verifications SET created_at = created_at - interval '25 hours'`); err != nil {
			t.Fatal(err)
		}
		const calls = 8
		errs := make([]error, calls)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() { errs[i] = f.h.ResendVerification(f.ctx, actor) })
		}
		wg.Wait()
		queued := 0
		for _, err := range errs {
			switch {
			case err == nil:
				queued++
			case domain.ErrorCode(err) != domain.CodeRateLimited:
				t.Fatalf("round %d: %v, want nil or rate_limited", round, err)
			}
		}
		if queued != 1 {
			t.Fatalf("round %d: %d of %d concurrent calls queued a message, want 1", round, queued, calls)
		}
	}
	if n := f.count(`SELECT count(*) FROM mail_outbox WHERE account_id = $1`, res.AccountID); n != 6 {
		t.Fatalf("%d messages queued, want the signup's and one a round (6)", n)
	}
	if n := f.count(`SELECT count(*) FROM email_verifications WHERE account_id = $1`, res.AccountID); n != 6 {
		t.Fatalf("%d tokens made, want 6", n)
	}
}
