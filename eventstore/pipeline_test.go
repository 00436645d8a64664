package eventstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// pipelined appends n events to stream through Pipelined, with one statement of the
// caller's (a SELECT) whose result it reads.
func pipelined(ctx context.Context, s *Store, cur *Cursor, stream string, n int) ([]Event, error) {
	return s.Pipelined(ctx, cur, []string{stream}, func(b *pgx.Batch) {
		b.Queue(`SELECT $1::int`, n)
	}, func(br pgx.BatchResults) ([]Appends, error) {
		var got int
		if err := br.QueryRow().Scan(&got); err != nil {
			return nil, err
		}
		a := Appends{StreamID: stream, StreamType: "ledger"}
		for i := range got {
			a.Events = append(a.Events, New{Type: "Charged", Payload: payload{i}})
		}
		return []Appends{a}, nil
	})
}

func fast(ctx context.Context, s *Store, cur *Cursor, stream string, n int, statements ...string) ([]Event, error) {
	a := Appends{StreamID: stream, StreamType: "ledger"}
	for i := range n {
		a.Events = append(a.Events, New{Type: "Charged", Payload: payload{i}})
	}
	return s.Fast(ctx, cur, func(b *pgx.Batch) {
		for _, q := range statements {
			b.Queue(q)
		}
	}, []Appends{a})
}

// checkLog asserts the chain verifies and stream holds versions 1..want.
func checkLog(t *testing.T, s *Store, stream string, want int) {
	t.Helper()
	ctx := context.Background()
	evs, err := Load(ctx, s.Pool(), stream)
	if err != nil || len(evs) != want {
		t.Fatalf("%s: %d events (%v), want %d", stream, len(evs), err, want)
	}
	for i, e := range evs {
		if e.Version != int64(i+1) {
			t.Fatalf("%s: event %d has version %d", stream, i, e.Version)
		}
	}
	if v, _ := StreamVersion(ctx, s.Pool(), stream); v != int64(want) {
		t.Fatalf("%s: stream version %d, want %d", stream, v, want)
	}
	if rep, err := Verify(ctx, s.Pool()); err != nil || rep.Tamper != nil {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

func TestFastAppendGoesStaleWhenAnythingMoved(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var cur Cursor
	defer cur.Close()

	// A cursor that has never appended knows nothing.
	if _, err := fast(ctx, s, &cur, "ledger-a", 1); !errors.Is(err, ErrStale) {
		t.Fatalf("fresh cursor: %v, want ErrStale", err)
	}
	if _, err := pipelined(ctx, s, &cur, "ledger-a", 2); err != nil {
		t.Fatal(err)
	}
	evs, err := fast(ctx, s, &cur, "ledger-a", 3)
	if err != nil || len(evs) != 3 || evs[0].Version != 3 || evs[2].Position != 5 {
		t.Fatalf("fast after pipelined: %+v %v", evs, err)
	}
	checkLog(t, s, "ledger-a", 5)

	tests := []struct {
		name   string
		before func() error // what happens between the cursor's last append and the fast one
		stmts  []string
		stream string
	}{
		{"another writer appended elsewhere", func() error { return appendOne(ctx, s, "other-1", 0, 1) }, nil, "ledger-a"},
		{"another writer appended to the stream", func() error {
			_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
				return tx.Append(ctx, "ledger-a", "ledger", AnyVersion, Metadata{}, New{Type: "Charged", Payload: payload{9}})
			})
			return err
		}, nil, "ledger-a"},
		// chain_at answers first: a batch whose head moved never runs its statements
		{"another writer appended: the statements do not run", func() error { return appendOne(ctx, s, "other-2", 0, 1) },
			[]string{`SELECT 1/0`}, "ledger-a"},
		{"a statement refuses", nil, []string{`DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'serialization_failure'; END $$`}, "ledger-a"},
		{"a stream the cursor never read", nil, nil, "ledger-new"},
	}
	want := 5
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				if err := tt.before(); err != nil {
					t.Fatal(err)
				}
				if tt.name == "another writer appended to the stream" {
					want++
				}
			}
			if _, err := fast(ctx, s, &cur, tt.stream, 1, tt.stmts...); !errors.Is(err, ErrStale) {
				t.Fatalf("fast: %v, want ErrStale", err)
			}
			checkLog(t, s, "ledger-a", want) // nothing written
			// The pipelined path catches up, and the cursor is good again.
			if _, err := pipelined(ctx, s, &cur, "ledger-a", 1); err != nil {
				t.Fatal(err)
			}
			if _, err := fast(ctx, s, &cur, "ledger-a", 1); err != nil {
				t.Fatalf("fast after catching up: %v", err)
			}
			want += 2
			checkLog(t, s, "ledger-a", want)
		})
	}
}

func TestFastAppendFailsOnAnErrorOfItsOwn(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var cur Cursor
	defer cur.Close()
	if _, err := pipelined(ctx, s, &cur, "ledger-a", 1); err != nil {
		t.Fatal(err)
	}
	// Not a refusal: a real error is reported as it is, and nothing is written.
	_, err := fast(ctx, s, &cur, "ledger-a", 1, `SELECT 1/0`)
	if err == nil || errors.Is(err, ErrStale) {
		t.Fatalf("fast with a failing statement: %v", err)
	}
	checkLog(t, s, "ledger-a", 1)
	if _, err := pipelined(ctx, s, &cur, "ledger-a", 1); err != nil {
		t.Fatalf("the cursor's next append: %v", err)
	}
	checkLog(t, s, "ledger-a", 2)
}

func TestPipelinedAppendsOnlyToStreamsItRead(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	_, err := s.Pipelined(ctx, nil, []string{"ledger-a"}, func(*pgx.Batch) {}, func(pgx.BatchResults) ([]Appends, error) {
		return []Appends{{StreamID: "ledger-b", StreamType: "ledger", Events: []New{{Type: "Charged", Payload: payload{}}}}}, nil
	})
	if err == nil {
		t.Fatal("an append to a stream the transaction did not read went through")
	}
	if v, _ := StreamVersion(ctx, s.Pool(), "ledger-b"); v != 0 {
		t.Fatalf("ledger-b has version %d", v)
	}
}

// Writers with cursors of their own and plain transactions, all on the same streams:
// every event lands once, versions stay contiguous and the chain verifies.
func TestCursorsAndTransactionsInterleave(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	streams := []string{"ledger-x", "ledger-y"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	count := map[string]int{}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cur Cursor
			defer cur.Close()
			for i := range 15 {
				stream := streams[(w+i)%2]
				var err error
				switch {
				case w == 3: // a writer without a cursor
					_, err = s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
						return tx.Append(ctx, stream, "ledger", AnyVersion, Metadata{}, New{Type: "Charged", Payload: payload{i}})
					})
				default:
					if _, err = fast(ctx, s, &cur, stream, 1); errors.Is(err, ErrStale) {
						_, err = pipelined(ctx, s, &cur, stream, 1)
					}
				}
				if err != nil {
					t.Error(fmt.Errorf("writer %d: %w", w, err))
					return
				}
				mu.Lock()
				count[stream]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, st := range streams {
		checkLog(t, s, st, count[st])
	}
}
