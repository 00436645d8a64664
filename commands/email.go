package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres"
)

// TopicMail is announced (NOTIFY) when a message is queued in mail_outbox: the mail
// sender wakes at the commit.
const TopicMail = "mail_outbox"

// verificationTTL is how long a verification token can be used.
const verificationTTL = 24 * time.Hour

// NewMailSealer seals the bodies queued in mail_outbox, each bound to its recipient (the
// row's to_email), and opens them for the mail sender: a message carries a usable
// token, and a copy of the database must not. Every server derives it from the same
// key pepper.
func NewMailSealer(pepper []byte) (*domain.Sealer, error) {
	return domain.NewSealer(pepper, "chessd mail outbox v1")
}

// queueVerification makes a verification token for the account's address and queues
// the message that carries it, inside the caller's transaction.
func (h *Handler) queueVerification(ctx context.Context, tx *eventstore.Tx, a *domain.Account, now time.Time) error {
	token, err := h.newToken(ctx, tx, "verify", "ev_", a, now, verificationTTL)
	if err != nil {
		return err
	}
	body := fmt.Sprintf("Welcome to chessd.\r\n\r\n"+
		"To verify this address for account %s, use this token within 24 hours:\r\n\r\n"+
		"    %s\r\n\r\n"+
		"Paste it on the console's Account page, %s/account (no key needed), or send it:\r\n\r\n"+
		"curl -X POST %s/verify-email -d '{\"token\":\"%s\"}'\r\n\r\n"+
		"If you did not sign up, ignore this message.\r\n", a.ID(), token, strings.TrimSuffix(h.APIURL, "/v1"), h.APIURL, token)
	return h.queueMail(ctx, tx, a, "Verify your e-mail address for chessd", body)
}

// newToken makes a one-use token for a's address, kept only as its HMAC, for purpose
// ('verify' or 'recover': each kind is accepted only where it is meant for).
func (h *Handler) newToken(ctx context.Context, tx *eventstore.Tx, purpose, prefix string, a *domain.Account, now time.Time, ttl time.Duration) (string, error) {
	token := prefix + randomBase62(32)
	if _, err := tx.Exec(ctx, `INSERT INTO email_verifications (token_hash, account_id, email, created_at, expires_at, purpose)
		VALUES ($1, $2, $3, $4, $5, $6)`, h.tokenHash(purpose, token), a.ID(), a.Email(), now, now.Add(ttl), purpose); err != nil {
		return "", fmt.Errorf("%s token: %w", purpose, err)
	}
	return token, nil
}

// queueMail queues a message to a's address in the mail outbox inside the caller's
// transaction, its body sealed (it carries a token); the mail sender wakes at the commit.
// It is due at once by due_at; next_attempt_at 'infinity' keeps it from an older
// chessd's sender, which claims by that and would mail the sealed body (package mail).
func (h *Handler) queueMail(ctx context.Context, tx *eventstore.Tx, a *domain.Account, subject, body string) error {
	seal, err := NewMailSealer(h.pepper)
	if err != nil {
		return fmt.Errorf("mail: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mail_outbox (account_id, to_email, subject, body, due_at, next_attempt_at)
		VALUES ($1, $2, $3, $4, now(), 'infinity')`,
		a.ID(), a.Email(), subject, seal.Seal(body, a.Email())); err != nil {
		return fmt.Errorf("queue mail: %w", err)
	}
	return eventstore.Notify(ctx, tx.Tx, TopicMail)
}

// VerifyEmail verifies the address of the account a token was sent for: the token
// must be unused, unexpired and for the account's current address. It returns the
// account; an account already verified stays verified (the token is still used up).
func (h *Handler) VerifyEmail(ctx context.Context, token, requestID string) (*domain.Account, error) {
	invalid := domain.Invalid("token", "is not a valid verification token, or it expired or was used: ask for a new one (POST /v1/me/verify-email)")
	var out *domain.Account
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		a, err := h.useToken(ctx, tx, "verify", token, invalid)
		if err != nil {
			return err
		}
		out = a
		return verifyAddress(ctx, tx, a, eventstore.Metadata{RequestID: requestID, AccountID: a.ID()}, h.now())
	})
	return out, err
}

// tokenHash is the form a token of purpose is stored in. A verification token's is its
// HMAC, as the releases before key recovery stored and look it up; any other purpose
// names itself in the HMAC, so that an older server, which knows of verification
// alone and takes any token at its /verify-email, finds none of them.
func (h *Handler) tokenHash(purpose, token string) []byte {
	if purpose == "verify" {
		return domain.HashSecret(h.pepper, token)
	}
	return domain.HashSecret(h.pepper, purpose+":"+token)
}

// useToken uses up a token of purpose (newToken's) and answers the account it was made
// for, or invalid when the token is unknown, of another purpose, expired, used, or for
// an address the account no longer has.
func (h *Handler) useToken(ctx context.Context, tx *eventstore.Tx, purpose, token string, invalid error) (*domain.Account, error) {
	if len(token) > 100 {
		return nil, invalid
	}
	var accountID, email string
	err := tx.QueryRow(ctx, `UPDATE email_verifications SET used_at = $3
		WHERE token_hash = $1 AND purpose = $2 AND used_at IS NULL AND expires_at > $3 RETURNING account_id, email`,
		h.tokenHash(purpose, token), purpose, h.now()).Scan(&accountID, &email)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, invalid
	}
	if err != nil {
		return nil, err
	}
	a, err := LoadAccount(ctx, tx, accountID)
	if err != nil {
		return nil, err
	}
	if a.Email() != email {
		return nil, invalid
	}
	return a, nil
}

// verifyAddress records a's address verified (once: nothing for one verified already).
func verifyAddress(ctx context.Context, tx *eventstore.Tx, a *domain.Account, md eventstore.Metadata, now time.Time) error {
	e := a.Verify(now)
	if e == nil {
		return nil
	}
	if err := tx.Append(ctx, domain.AccountStream(a.ID()), domain.StreamAccount, a.Version(), md, event(e)); err != nil {
		return err
	}
	a.Apply(e)
	return nil
}

// MaxVerificationMails is how many messages with a token (verification and key
// recovery) an account's address gets in 24 hours (signup's included): an account
// cannot verify the address it gave, so without a cap anyone could sign up with
// someone else's and mail it every minute.
const MaxVerificationMails = 5

// MailsFull refuses a message with a token past one a minute or MaxVerificationMails
// a day (429): the refusal is about time, so it says when the next may go
// (Retry-After), as a ping past its rate does.
type MailsFull struct {
	msg  string
	wait time.Duration
}

func (e *MailsFull) Error() string             { return e.msg }
func (e *MailsFull) Unwrap() error             { return domain.Errorf(domain.CodeRateLimited, "%s", e.msg) }
func (e *MailsFull) RetryAfter() time.Duration { return e.wait }

// ResendVerification queues a new verification message for the actor's account (409
// when it is verified already; MailsFull past one a minute or MaxVerificationMails a
// day).
func (h *Handler) ResendVerification(ctx context.Context, actor Actor) error {
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		a, err := LoadAccount(ctx, tx, actor.Key.AccountID())
		if err != nil {
			return err
		}
		if a.Verified() {
			return domain.Errorf(domain.CodeConflict, "the address %s is already verified", a.Email())
		}
		now := h.now()
		if err := mailRoom(ctx, tx, a, now); err != nil {
			return err
		}
		return h.queueVerification(ctx, tx, a, now)
	})
	return err
}

// mailRoom refuses (MailsFull) a message with a token to a's address past one a minute
// or MaxVerificationMails a day, verification and recovery messages together: the
// address may be someone else's, who cannot stop them. It holds the account's mail
// lock until the caller's transaction ends, so that concurrent calls take turns: without
// it, each found no recent message and each queued one.
func mailRoom(ctx context.Context, tx *eventstore.Tx, a *domain.Account, now time.Time) error {
	if err := postgres.LockXact(ctx, tx, "verify-email:"+a.ID(), false); err != nil {
		return err
	}
	var today int
	var oldest, latest time.Time
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(min(created_at), $2), coalesce(max(created_at), $2)
		FROM email_verifications WHERE account_id = $1 AND created_at > $2`,
		a.ID(), now.Add(-24*time.Hour)).Scan(&today, &oldest, &latest); err != nil {
		return err
	}
	// Both limits may hold: the refusal names the one that ends last, so a client that
	// waits its Retry-After is not refused again.
	var full *MailsFull
	if next := latest.Add(time.Minute); today > 0 && next.After(now) {
		full = &MailsFull{wait: next.Sub(now),
			msg: fmt.Sprintf("a message was sent to %s less than a minute ago; check its inbox", a.Email())}
	}
	if next := oldest.Add(24 * time.Hour); today >= MaxVerificationMails && (full == nil || next.Sub(now) > full.wait) {
		full = &MailsFull{wait: next.Sub(now), msg: fmt.Sprintf("%d messages went to %s in the last 24 hours, the most it gets; the next may be sent after %s",
			today, a.Email(), next.UTC().Format(time.RFC3339))}
	}
	if full != nil {
		return full
	}
	return nil
}
