// Package auth turns a bearer secret into the key and account it opens. It reads the
// write side (streams, events, through commands' loaders) so that authentication never
// depends on projection lag, and the key_secrets and api_keys read models only as an
// index from a secret's hash to its key.
package auth

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/memo"
)

// Keys and accounts are what a server keeps in memory to authenticate: every append to
// their streams is announced to watchers, and waits for them (eventstore.Watcher).
func init() {
	eventstore.RegisterWatched(domain.StreamKey)
	eventstore.RegisterWatched(domain.StreamAccount)
}

// Authenticator turns a bearer secret into the key it opens, consistent with every
// committed event whatever the projection's lag:
//   - the read model maps the secret's hash to a key id, and the streams table gives
//     the key stream's current version in the same query;
//   - a key whose cached state is at that version is decided from the cache; otherwise
//     its events are folded afresh;
//   - a hash the read model does not know yet (a key created or rotated a moment ago)
//     is looked up in the events themselves.
type Authenticator struct {
	pool   *pgxpool.Pool
	pepper []byte
	now    func() time.Time
	cache  memo.Map // stream id -> *domain.Key or *domain.Account, at most maxCached

	remembered memo.Map // secret hash -> remembered, at most maxRemembered
	versions   *versionReader
	watcher    *eventstore.Watcher // nil: versions are read on every call
}

// remembered is what a secret opened when it was last checked in the database.
type remembered struct {
	key     *domain.Key
	account *domain.Account
	mark    int64 // the watcher's mark taken before that check
}

// maxRemembered bounds the secrets kept in memory, maxCached the keys' and accounts'
// states; past either, all of its kind are forgotten.
const maxRemembered, maxCached = 100_000, 100_000

// Remembered is Authenticate for the hot path of costed calls: the key and account a
// secret opened last time are kept in memory. With a watcher (Watch), they are answered
// from memory while the watcher has heard of no change to either since they were
// checked: every change to a key or an account, on any server, returns to its caller
// only once every watching server has heard of it. Without one, or when the watcher
// cannot vouch (it lost its connection or its lease), one primary-key lookup of their
// streams' versions tells whether either has changed. Either way the next call after
// any change (a revocation, rotation, PATCH or plan change) sees it, on every server,
// before any engine starts. A change that lands during the search applies from the
// next call: the call was authorised when it started.
func (a *Authenticator) Remembered(ctx context.Context, secret string) (*domain.Key, *domain.Account, error) {
	if !WellFormedSecret(secret) {
		return a.Authenticate(ctx, secret)
	}
	hash := domain.HashSecret(a.pepper, secret)
	if v, ok := a.remembered.Load(string(hash)); ok {
		r := v.(remembered)
		if a.vouches(r) {
			return a.checkedOrForgotten(r, hash)
		}
		mark := a.mark()
		vs, err := a.versions.read(ctx, domain.KeyStream(r.key.ID()), domain.AccountStream(r.key.AccountID()))
		if err != nil {
			return nil, nil, err
		}
		if vs[0] == r.key.Version() && vs[1] == r.account.Version() {
			r.mark = mark
			a.remembered.Store(string(hash), r)
			return a.checkedOrForgotten(r, hash)
		}
		a.remembered.Delete(string(hash))
	}
	return a.Authenticate(ctx, secret)
}

// Known says whether secret opened a key when this server last checked it (whether or
// not the watcher still vouches for what it opened): a client's own key, not a guess.
// No I/O.
func (a *Authenticator) Known(secret string) bool {
	if !WellFormedSecret(secret) {
		return false
	}
	_, ok := a.remembered.Load(string(domain.HashSecret(a.pepper, secret)))
	return ok
}

// Vouched is Remembered when memory alone can answer: the secret was checked before,
// and the watcher vouches that neither its key nor its account has changed since.
// vouched is false when only the database can tell (Remembered then asks it); err is
// the key's own refusal (a rotated-out secret past its grace). No I/O, no wait: a
// caller can do the rest of its work after it rather than beside it.
func (a *Authenticator) Vouched(secret string) (key *domain.Key, acct *domain.Account, vouched bool, err error) {
	if a.watcher == nil || !WellFormedSecret(secret) {
		return nil, nil, false, nil
	}
	hash := domain.HashSecret(a.pepper, secret)
	v, ok := a.remembered.Load(string(hash))
	if !ok {
		return nil, nil, false, nil
	}
	r := v.(remembered)
	if !a.vouches(r) {
		return nil, nil, false, nil
	}
	key, acct, err = a.checkedOrForgotten(r, hash)
	return key, acct, true, err
}

// vouches says whether the watcher has heard of no change to r's key or account since
// r was checked.
func (a *Authenticator) vouches(r remembered) bool {
	return a.watcher != nil && a.watcher.Unchanged(r.mark, domain.KeyStream(r.key.ID()), domain.AccountStream(r.key.AccountID()))
}

// checked is r once its secret passes the key's own checks at this moment (a
// rotated-out secret's grace ends by the clock).
func (a *Authenticator) checked(r remembered, hash []byte) (*domain.Key, *domain.Account, error) {
	if err := r.key.Authenticate(hash, a.now()); err != nil {
		return nil, nil, err
	}
	return r.key, r.account, nil
}

// checkedOrForgotten is checked, forgetting the secret when it is refused (a
// rotated-out secret past its grace): a refused secret is no longer Known.
func (a *Authenticator) checkedOrForgotten(r remembered, hash []byte) (*domain.Key, *domain.Account, error) {
	k, acct, err := a.checked(r, hash)
	if err != nil {
		a.remembered.Delete(string(hash))
	}
	return k, acct, err
}

// mark is taken before a check in the database, so that the watcher can later tell
// whether anything changed after it.
func (a *Authenticator) mark() int64 {
	if a.watcher == nil {
		return 0
	}
	return a.watcher.Mark()
}

// Watch makes Remembered answer from memory what the watcher vouches for, until ctx
// ends. Call it once, before serving.
func (a *Authenticator) Watch(ctx context.Context, logger *slog.Logger) {
	a.watcher = eventstore.Watch(ctx, a.pool, logger)
}

// NewAuthenticator builds an Authenticator with the server's pepper.
func NewAuthenticator(pool *pgxpool.Pool, pepper []byte) *Authenticator {
	a := &Authenticator{pool: pool, pepper: pepper, now: time.Now, versions: &versionReader{pool: pool}}
	a.cache.Max, a.remembered.Max = maxCached, maxRemembered
	return a
}

// WellFormedSecret checks the shape of a secret before any lookup.
func WellFormedSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, "ce_live_")
	if !ok {
		rest, ok = strings.CutPrefix(s, "ce_test_")
	}
	if !ok || len(rest) < 40 || len(rest) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// Authenticate returns the active key that secret opens, with its account, or a
// CodeBadCredential error. One query answers the common case. What it opened is
// remembered (Remembered, Known); a refused secret is forgotten.
func (a *Authenticator) Authenticate(ctx context.Context, secret string) (*domain.Key, *domain.Account, error) {
	if !WellFormedSecret(secret) {
		return nil, nil, domain.Errorf(domain.CodeBadCredential, "malformed API key (expected ce_live_... or ce_test_...)")
	}
	hash := domain.HashSecret(a.pepper, secret)
	mark := a.mark() // before the reads: a change after them is one the watcher tells of
	k, acct, err := a.lookup(ctx, hash)
	switch {
	case err == nil:
		a.remembered.Store(string(hash), remembered{key: k, account: acct, mark: mark})
	case domain.ErrorCode(err) == domain.CodeBadCredential:
		a.remembered.Delete(string(hash))
	}
	return k, acct, err
}

// lookup is Authenticate's reading of the database.
func (a *Authenticator) lookup(ctx context.Context, hash []byte) (*domain.Key, *domain.Account, error) {
	var keyID string
	var keyVersion int64
	var accountID *string
	var accountVersion *int64
	err := a.pool.QueryRow(ctx, `SELECT ks.key_id, s.version, k.account_id, av.version FROM key_secrets ks
		JOIN streams s ON s.stream_id = 'key-' || ks.key_id
		LEFT JOIN api_keys k ON k.key_id = ks.key_id
		LEFT JOIN streams av ON av.stream_id = 'account-' || k.account_id
		WHERE ks.secret_hash = $1`, hash).Scan(&keyID, &keyVersion, &accountID, &accountVersion)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var stream string
		err = a.pool.QueryRow(ctx, `SELECT stream_id FROM events
			WHERE event_type IN ('KeyCreated', 'KeyRotated') AND payload ->> 'secret_hash' = $1 LIMIT 1`,
			hex.EncodeToString(hash)).Scan(&stream)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil, domain.Errorf(domain.CodeBadCredential, "unknown API key")
		}
		if err != nil {
			return nil, nil, err
		}
		keyID = strings.TrimPrefix(stream, "key-")
	case err != nil:
		return nil, nil, err
	}
	key, err := a.fresh(ctx, "key-"+keyID, keyVersion, func() (any, error) { return commands.LoadKey(ctx, a.pool, keyID) })
	if err != nil {
		return nil, nil, err
	}
	k := key.(*domain.Key)
	if err := k.Authenticate(hash, a.now()); err != nil {
		return nil, nil, err
	}
	var av int64
	if accountVersion != nil {
		av = *accountVersion
	}
	acct, err := a.fresh(ctx, "account-"+k.AccountID(), av, func() (any, error) { return commands.LoadAccount(ctx, a.pool, k.AccountID()) })
	if err != nil {
		return nil, nil, err
	}
	return k, acct.(*domain.Account), nil
}

type versioned interface{ Version() int64 }

// fresh returns the cached aggregate of stream when it is at version, else loads it.
// Version 0 (unknown) always loads.
func (a *Authenticator) fresh(ctx context.Context, stream string, version int64, load func() (any, error)) (any, error) {
	if v, ok := a.cache.Load(stream); ok && version != 0 && v.(versioned).Version() == version {
		return v, nil
	}
	v, err := load()
	if err != nil {
		return nil, err
	}
	a.cache.Store(stream, v)
	return v, nil
}
