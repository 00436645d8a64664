package eventstore

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/postgres/pgtest"
)

// cutMarker is a statement only the transaction under test sends: the proxy cuts the
// COMMIT of the transaction that ran it.
const cutMarker = "SELECT 'cut this transaction'"

// When the connection fails once COMMIT may have been sent, the outcome is found out,
// never guessed: Transact reports its events if the transaction committed and
// ErrNotCommitted if not; Fast and Pipelined report an *UncertainCommitError that
// Settle resolves, and Settle says nothing while the database does not answer.
func TestUncertainCommitsAreSettled(t *testing.T) {
	ways := []struct {
		name string
		run  func(ctx context.Context, s *Store, cur *Cursor) ([]Event, error)
	}{
		{"transact", func(ctx context.Context, s *Store, _ *Cursor) ([]Event, error) {
			return s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
				if _, err := tx.Exec(ctx, cutMarker); err != nil {
					return err
				}
				return tx.Append(ctx, "s-1", "ledger", AnyVersion, Metadata{}, New{Type: "Charged", Payload: payload{1}})
			})
		}},
		{"pipelined", func(ctx context.Context, s *Store, cur *Cursor) ([]Event, error) {
			return s.Pipelined(ctx, cur, []string{"s-1"}, func(b *pgx.Batch) { b.Queue(cutMarker) },
				func(br pgx.BatchResults) ([]Appends, error) {
					if _, err := br.Exec(); err != nil {
						return nil, err
					}
					return []Appends{{StreamID: "s-1", StreamType: "ledger", Events: []New{{Type: "Charged", Payload: payload{1}}}}}, nil
				})
		}},
		{"fast", func(ctx context.Context, s *Store, cur *Cursor) ([]Event, error) {
			return fast(ctx, s, cur, "s-1", 1, cutMarker)
		}},
	}
	for _, way := range ways {
		for _, tc := range []struct {
			mode      pgtest.CutMode
			committed bool
		}{{pgtest.AfterCommit, true}, {pgtest.BeforeCommit, false}} {
			name := way.name + "/not committed"
			if tc.committed {
				name = way.name + "/committed"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				proxy, url := pgtest.NewProxy(t, pgtest.URL(t))
				s := NewStore(pgtest.NewDBAt(t, url), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
				var cur Cursor
				defer cur.Close()
				if _, err := pipelined(ctx, s, &cur, "s-1", 1); err != nil { // the cursor now knows the stream: Fast can go
					t.Fatal(err)
				}
				cut := proxy.CutCommit(cutMarker, tc.mode)
				evs, err := way.run(ctx, s, &cur)
				select {
				case <-cut:
				default:
					t.Fatalf("the connection was not cut (%v)", err)
				}
				var unsure *UncertainCommitError
				if errors.As(err, &unsure) {
					// Nothing is said while the database does not answer.
					proxy.Down()
					short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					_, serr := s.Settle(short, unsure)
					cancel()
					if serr == nil {
						t.Fatal("Settle gave an outcome while the database was away")
					}
					proxy.Up()
					committed, serr := s.Settle(ctx, unsure)
					if serr != nil || committed != tc.committed {
						t.Fatalf("Settle: committed %v (%v), want %v", committed, serr, tc.committed)
					}
				} else if way.name != "transact" {
					t.Fatalf("%s after a cut COMMIT: %v, want an *UncertainCommitError", way.name, err)
				} else if tc.committed && (err != nil || len(evs) != 1) {
					t.Fatalf("transact that committed: %d events, %v", len(evs), err)
				} else if !tc.committed && !errors.Is(err, ErrNotCommitted) {
					t.Fatalf("transact that did not commit: %v, want ErrNotCommitted", err)
				}
				want := 1
				if tc.committed {
					want = 2
				}
				checkLog(t, s, "s-1", want)
			})
		}
	}
}
