package auth

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var testPepper = []byte("auth-test-pepper-0123456789abcdef")

// vouching waits until a's watcher vouches for what is read from now on.
func vouching(t *testing.T, a *Authenticator) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if m := a.watcher.Mark(); a.watcher.Unchanged(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher never began to vouch")
		}
	}
}

// world is what these tests start from: a database, a command handler whose changes
// come as from another server, and an account with its admin key.
type world struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
	cmds   *commands.Handler
	signup commands.SignupResult
	admin  *domain.Key
}

func newWorld(ctx context.Context, t *testing.T, email string) world {
	t.Helper()
	w := world{pool: pgtest.NewDB(t), logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	w.cmds = commands.New(eventstore.NewStore(w.pool, w.logger), testPepper)
	var err error
	if w.signup, err = w.cmds.Signup(ctx, domain.Signup{Email: email}, "req-1"); err != nil {
		t.Fatal(err)
	}
	if w.admin, _, err = NewAuthenticator(w.pool, testPepper).Authenticate(ctx, w.signup.Secret); err != nil {
		t.Fatal(err)
	}
	return w
}

// Remembered answers from memory while its watcher vouches for it, and still sees every
// change on the next call; without a watcher it reads the versions on every call.
func TestRememberedReadsOnlyWhatChanged(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(ctx, t, "remembered@example.com")
	pool, logger, cmds, signup, admin := w.pool, w.logger, w.cmds, w.signup, w.admin
	for _, tt := range []struct {
		name  string
		watch bool
	}{{"watching", true}, {"reading versions", false}} {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAuthenticator(pool, testPepper)
			if tt.watch {
				a.Watch(ctx, logger)
				vouching(t, a)
			}
			key, secret, err := cmds.CreateKey(ctx, commands.Actor{Key: admin, RequestID: "req-2"},
				domain.KeySettings{Label: tt.name, Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.Remembered(ctx, secret); err != nil {
				t.Fatal(err)
			}
			before := a.versions.queries.Load()
			const calls = 10
			for range calls {
				if _, _, err := a.Remembered(ctx, secret); err != nil {
					t.Fatal(err)
				}
			}
			reads := a.versions.queries.Load() - before
			if want := map[bool]int64{true: 0, false: calls}[tt.watch]; reads != want {
				t.Fatalf("%d calls with nothing changed read the versions %d times, want %d", calls, reads, want)
			}

			plan := domain.PlanPro
			if tt.watch {
				plan = domain.PlanHobby
			}
			if err := cmds.ChangePlan(ctx, signup.AccountID, plan, "test"); err != nil {
				t.Fatal(err)
			}
			_, acct, err := a.Remembered(ctx, secret)
			if err != nil {
				t.Fatal(err)
			}
			if acct.Plan() != plan {
				t.Fatalf("the next call after a plan change sees plan %v, want %v", acct.Plan(), plan)
			}
			if _, err := cmds.RevokeKey(ctx, commands.Actor{Key: admin, RequestID: "req-3"}, key.ID()); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.Remembered(ctx, secret); domain.ErrorCode(err) != domain.CodeBadCredential {
				t.Fatalf("the next call after a revocation: %v, want it refused", err)
			}
		})
	}
}

// Vouched answers from memory only what its watcher vouches for: never a secret not
// checked in the database before, nor anything without a watcher, nor a key whose key
// or account changed since its check; Remembered's next check makes it vouched again.
func TestVouched(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(ctx, t, "vouched@example.com")
	pool, logger, cmds, signup, admin := w.pool, w.logger, w.cmds, w.signup, w.admin
	key, secret, err := cmds.CreateKey(ctx, commands.Actor{Key: admin, RequestID: "req-2"},
		domain.KeySettings{Label: "vouched", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
	if err != nil {
		t.Fatal(err)
	}
	watching, unwatched := NewAuthenticator(pool, testPepper), NewAuthenticator(pool, testPepper)
	watching.Watch(ctx, logger)
	vouching(t, watching)
	check := func(a *Authenticator) func() error {
		return func() error { _, _, err := a.Remembered(ctx, secret); return err }
	}
	plan := func(p domain.Plan) func() error {
		return func() error { return cmds.ChangePlan(ctx, signup.AccountID, p, "test") }
	}
	revoke := func() error {
		_, err := cmds.RevokeKey(ctx, commands.Actor{Key: admin, RequestID: "req-3"}, key.ID())
		return err
	}
	for _, step := range []struct {
		name    string
		first   func() error // a check in the database, or a change from another server
		a       *Authenticator
		vouched bool
		plan    domain.Plan // the account's, when vouched
	}{
		{"never checked", nil, watching, false, domain.Plan{}},
		{"checked", check(watching), watching, true, signup.Plan},
		{"checked, without a watcher", check(unwatched), unwatched, false, domain.Plan{}},
		{"after a plan change", plan(domain.PlanPro), watching, false, domain.Plan{}},
		{"checked again", check(watching), watching, true, domain.PlanPro},
		{"after another plan change", plan(domain.PlanHobby), watching, false, domain.Plan{}},
		{"checked once more", check(watching), watching, true, domain.PlanHobby},
		{"after a revocation", revoke, watching, false, domain.Plan{}},
	} {
		if step.first != nil {
			if err := step.first(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		}
		k, acct, vouched, err := step.a.Vouched(secret)
		switch {
		case err != nil:
			t.Fatalf("%s: %v", step.name, err)
		case vouched != step.vouched:
			t.Fatalf("%s: vouched %v, want %v", step.name, vouched, step.vouched)
		case vouched && (k.ID() != key.ID() || acct.Plan() != step.plan):
			t.Fatalf("%s: vouched for key %s on plan %v, want %s on %v", step.name, k.ID(), acct.Plan(), key.ID(), step.plan)
		case !vouched && k != nil:
			t.Fatalf("%s: not vouched, yet gave key %s", step.name, k.ID())
		}
	}
	if _, _, err := watching.Remembered(ctx, secret); domain.ErrorCode(err) != domain.CodeBadCredential {
		t.Fatalf("after the revocation, Remembered: %v, want it refused", err)
	}
	if _, _, vouched, _ := watching.Vouched(secret); vouched {
		t.Fatal("a refused secret is vouched for")
	}
}

// What the authenticator keeps in memory is bounded: keys created, used once and
// revoked, over and over (anyone with keys:write can), do not pile up; a key forgotten
// is loaded again and answered alike.
func TestMemoryIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(ctx, t, "bounded@example.com")
	a := NewAuthenticator(w.pool, testPepper)
	const bound, keys = 8, 20
	a.cache.Max, a.remembered.Max = bound, bound
	var secrets []string
	for i := range keys {
		key, secret, err := w.cmds.CreateKey(ctx, commands.Actor{Key: w.admin, RequestID: fmt.Sprintf("req-c%d", i)},
			domain.KeySettings{Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.Remembered(ctx, secret); err != nil {
			t.Fatal(err)
		}
		if _, err := w.cmds.RevokeKey(ctx, commands.Actor{Key: w.admin, RequestID: fmt.Sprintf("req-r%d", i)}, key.ID()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.Remembered(ctx, secret); domain.ErrorCode(err) != domain.CodeBadCredential {
			t.Fatalf("key %d after its revocation: %v, want it refused", i, err)
		}
		secrets = append(secrets, secret)
		if n, m := a.cache.Len(), a.remembered.Len(); n > bound || m > bound {
			t.Fatalf("after %d keys the authenticator keeps %d keys' and accounts' states and %d secrets, want at most %d each", i+1, n, m, bound)
		}
	}
	for i, s := range secrets { // forgotten or not, each is refused as revoked
		if _, _, err := a.Remembered(ctx, s); domain.ErrorCode(err) != domain.CodeBadCredential {
			t.Fatalf("key %d, asked again: %v, want it refused", i, err)
		}
	}
	if _, _, err := a.Remembered(ctx, w.signup.Secret); err != nil {
		t.Fatalf("the admin key: %v", err)
	}
}

// Known says a secret opened a key when this server last checked it: not before it
// was checked, and no more once it is refused, also when memory refuses it (a
// rotated-out secret past its grace, by the clock): a refused secret counts as a
// guess again (httpapi's bad-key limit holds such back).
func TestKnown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(ctx, t, "known@example.com")
	actor := commands.Actor{Key: w.admin, RequestID: "req-2"}
	key, secret, err := w.cmds.CreateKey(ctx, actor, domain.KeySettings{Label: "known", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAuthenticator(w.pool, testPepper)
	a.Watch(ctx, w.logger)
	vouching(t, a)
	if a.Known(secret) {
		t.Fatal("a secret never checked is known")
	}
	if _, _, err := a.Authenticate(ctx, secret); err != nil || !a.Known(secret) {
		t.Fatalf("a secret that opened its key: %v, known %v", err, a.Known(secret))
	}
	if _, _, err := w.cmds.RotateKey(ctx, actor, key.ID(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Remembered(ctx, secret); err != nil || !a.Known(secret) { // within its grace
		t.Fatalf("the old secret within its grace: %v, known %v", err, a.Known(secret))
	}
	a.now = func() time.Time { return time.Now().Add(2 * time.Hour) } // the grace is over
	if _, _, vouched, err := a.Vouched(secret); !vouched || domain.ErrorCode(err) != domain.CodeBadCredential || a.Known(secret) {
		t.Fatalf("the old secret past its grace, refused from memory: vouched %v, %v, known %v", vouched, err, a.Known(secret))
	}
}
