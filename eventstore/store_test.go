package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func newStore(t *testing.T) *Store {
	t.Helper()
	return NewStore(pgtest.NewDB(t), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

type payload struct {
	N int `json:"n"`
}

func appendOne(ctx context.Context, s *Store, stream string, expected int64, n int) error {
	_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		return tx.Append(ctx, stream, "test", expected, Metadata{RequestID: "req"}, New{Type: "Happened", Payload: payload{n}})
	})
	return err
}

// follow reads the log from position 0 until it has want events or the deadline passes,
// returning every event delivered, in delivery order.
func follow(ctx context.Context, pool *pgxpool.Pool, want int, stop <-chan struct{}) ([]Event, error) {
	var got []Event
	var last int64
	stopped := false
	for len(got) < want {
		evs, err := ReadFrom(ctx, pool, last, 100)
		if err != nil {
			return got, err
		}
		for _, e := range evs {
			got = append(got, e)
			last = e.Position
		}
		if len(evs) == 0 {
			if stopped {
				return got, nil
			}
			select {
			case <-stop:
				stopped = true // read once more: the last commits may have landed after our read
			case <-ctx.Done():
				return got, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return got, nil
}

// followFrom reads the log after position after until it has want more events or
// ctx ends.
func followFrom(ctx context.Context, pool *pgxpool.Pool, after int64, want int) ([]Event, error) {
	var got []Event
	for len(got) < want {
		evs, err := ReadFrom(ctx, pool, after, 100)
		if err != nil {
			return got, err
		}
		for _, e := range evs {
			got = append(got, e)
			after = e.Position
		}
		if len(evs) == 0 {
			select {
			case <-ctx.Done():
				return got, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return got, nil
}

// waitLockWaiter waits until a session of the test's database is waiting for a lock.
func waitLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session ever waited for a lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConcurrentAppendsSameExpectedVersionOneWins(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := appendOne(ctx, s, "s-1", 0, 0); err != nil {
		t.Fatal(err)
	}
	const writers = 10
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- appendOne(ctx, s, "s-1", 1, i)
		}()
	}
	wg.Wait()
	close(errs)
	wins, conflicts := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			wins++
		case errors.Is(err, ErrConcurrency):
			conflicts++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if wins != 1 || conflicts != writers-1 {
		t.Fatalf("wins=%d conflicts=%d, want 1 and %d", wins, conflicts, writers-1)
	}
	evs, err := Load(ctx, s.Pool(), "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[1].Version != 2 {
		t.Fatalf("stream has %d events, want exactly 2 (versions 1, 2)", len(evs))
	}
	head, _ := Head(ctx, s.Pool())
	if head != 2 {
		t.Fatalf("head = %d, losers must write nothing", head)
	}
}

func TestNewStreamExpectedZeroConflicts(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := appendOne(ctx, s, "s-1", 0, 1); err != nil {
		t.Fatal(err)
	}
	var ce *ConcurrencyError
	if err := appendOne(ctx, s, "s-1", 0, 2); !errors.As(err, &ce) || ce.StreamID != "s-1" {
		t.Fatalf("second create: %v, want *ConcurrencyError", err)
	}
	if err := appendOne(ctx, s, "s-1", 5, 2); !errors.Is(err, ErrConcurrency) {
		t.Fatalf("wrong expected version: %v", err)
	}
}

// Transaction A appends first; B appends and commits while A is still open; then A
// commits. A follower of the global position must deliver both, each once.
func TestFollowerDeliversLateCommit(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	aAppended, bCommitted := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
			if err := tx.Append(ctx, "a", "test", 0, Metadata{}, New{Type: "A", Payload: payload{1}}); err != nil {
				return err
			}
			close(aAppended)
			<-bCommitted
			return nil
		})
		aDone <- err
	}()
	<-aAppended
	if err := appendOne(ctx, s, "b", 0, 2); err != nil {
		t.Fatal(err)
	}
	// the follower reads B alone while A is still open...
	first, err := follow(ctx, s.Pool(), 1, nil)
	if err != nil || len(first) != 1 || first[0].StreamID != "b" {
		t.Fatalf("while A is open the follower got %+v (%v), want B alone", first, err)
	}
	close(bCommitted)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	// ...and A once it commits, after B: nothing skipped, nothing twice
	rest, err := followFrom(ctx, s.Pool(), first[0].Position, 1)
	if err != nil {
		t.Fatal(err)
	}
	evs := append(first, rest...)
	if len(evs) != 2 {
		t.Fatalf("follower delivered %d events, want 2", len(evs))
	}
	seen := map[string]int{}
	for _, e := range evs {
		seen[e.StreamID]++
	}
	if seen["a"] != 1 || seen["b"] != 1 {
		t.Fatalf("delivered %v, want a and b once each", seen)
	}
}

// A holds the chain (events written, not committed) while B tries to append: B must wait,
// and the follower must see neither until A commits, then both in order.
func TestFollowerNeverSkipsUncommittedPosition(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hold, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookBeforeCommit = func(tx *Tx) {
		if tx.pending[0].StreamID == "a" {
			once.Do(func() { close(hold) })
			<-release
		}
	}
	t.Cleanup(func() { testHookBeforeCommit = nil })

	aDone := make(chan error, 1)
	go func() { aDone <- appendOne(ctx, s, "a", 0, 1) }()
	<-hold
	bDone := make(chan error, 1)
	go func() { bDone <- appendOne(ctx, s, "b", 0, 2) }()

	waitLockWaiter(t, s.Pool()) // B waits for the chain A holds
	if evs, err := ReadFrom(ctx, s.Pool(), 0, 10); err != nil || len(evs) != 0 {
		t.Fatalf("follower saw %d events while position 1 was uncommitted (err %v)", len(evs), err)
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	evs, err := follow(ctx, s.Pool(), 2, nil)
	if err != nil || len(evs) != 2 {
		t.Fatalf("got %d events, err %v", len(evs), err)
	}
	if evs[0].StreamID != "a" || evs[0].Position != 1 || evs[1].StreamID != "b" || evs[1].Position != 2 {
		t.Fatalf("order: %s@%d %s@%d", evs[0].StreamID, evs[0].Position, evs[1].StreamID, evs[1].Position)
	}
}

func TestFollowerUnderConcurrentWritersSeesEveryEventOnce(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const writers, each = 8, 40
	stop := make(chan struct{})
	followed := make(chan []Event, 1)
	go func() {
		evs, _ := follow(ctx, s.Pool(), writers*each, stop)
		followed <- evs
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := appendOne(ctx, s, fmt.Sprintf("w%d", w), int64(i), i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	evs := <-followed
	if len(evs) != writers*each {
		t.Fatalf("follower saw %d events, want %d", len(evs), writers*each)
	}
	for i, e := range evs {
		if e.Position != int64(i+1) {
			t.Fatalf("event %d has position %d: skipped or repeated", i, e.Position)
		}
	}
	rep, err := Verify(ctx, s.Pool())
	if err != nil || rep.Tamper != nil || rep.Events != writers*each {
		t.Fatalf("verify after load: %+v %v", rep, err)
	}
}

func TestRolledBackAppendLeavesNoStall(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	boom := errors.New("boom")
	_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.Append(ctx, "x", "test", 0, Metadata{}, New{Type: "X", Payload: payload{}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if err := appendOne(ctx, s, "x", 0, 1); err != nil {
		t.Fatalf("stream must be free after rollback: %v", err)
	}
	evs, err := follow(ctx, s.Pool(), 1, nil)
	if err != nil || len(evs) != 1 || evs[0].Position != 1 {
		t.Fatalf("after a rollback the next append must take position 1: %+v %v", evs, err)
	}
	var msgs int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM watermill_accounts`).Scan(&msgs); err != nil || msgs != 1 {
		t.Fatalf("bus has %d messages (err %v), want 1: the rolled-back one must not be published", msgs, err)
	}
}

func TestVerifyCatchesTampering(t *testing.T) {
	cases := []struct {
		name   string
		tamper string
		pos    int64
		kind   string
	}{
		{"intact", ``, 0, ""},
		{"edited payload", `UPDATE events SET payload = '{"n":999}' WHERE position = 4`, 4, "edited"},
		{"edited metadata", `UPDATE events SET metadata = '{}' WHERE position = 2`, 2, "edited"},
		{"deleted middle", `DELETE FROM events WHERE position = 3`, 3, "deleted"},
		{"deleted tail", `DELETE FROM events WHERE position = 6`, 6, "deleted"},
		{"swapped", `UPDATE events SET position = 1000 WHERE position = 3;
			UPDATE events SET position = 3 WHERE position = 5;
			UPDATE events SET position = 5 WHERE position = 1000`, 3, "reordered"},
		// off the chain's walk, which starts after 0; streams' readers would fold it in
		{"inserted before the start", `ALTER TABLE events DROP CONSTRAINT events_position_positive;
			INSERT INTO events (position, stream_id, stream_type, version, event_type, schema_version, payload, metadata, recorded_at, hash)
			SELECT 0, stream_id, stream_type, 4, event_type, schema_version, '{"n":1000000}', metadata, recorded_at, hash FROM events WHERE position = 5`, 0, "inserted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ctx := context.Background()
			// positions 1..6 alternate between streams p and q: p has 1,3,5; q has 2,4,6
			for i := range 6 {
				stream := []string{"p", "q"}[i%2]
				if err := appendOne(ctx, s, stream, int64(i/2), i); err != nil {
					t.Fatal(err)
				}
			}
			if tc.tamper != "" {
				if _, err := s.Pool().Exec(ctx, tc.tamper); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := Verify(ctx, s.Pool())
			if err != nil {
				t.Fatal(err)
			}
			if tc.kind == "" {
				if rep.Tamper != nil || rep.Events != 6 {
					t.Fatalf("intact chain reported %+v", rep)
				}
				return
			}
			if rep.Tamper == nil {
				t.Fatalf("tampering not detected")
			}
			if rep.Tamper.Position != tc.pos || rep.Tamper.Kind != tc.kind {
				t.Fatalf("got %v, want position %d %s", rep.Tamper, tc.pos, tc.kind)
			}
		})
	}
}

func TestAnyVersionAppendsTakeContiguousVersions(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
					// two appends to the same stream in one transaction, plus another stream
					for range 2 {
						if err := tx.Append(ctx, "ledger-k", "ledger", AnyVersion, Metadata{}, New{Type: "Charged", Payload: payload{w*10 + i}}); err != nil {
							return err
						}
					}
					return tx.Append(ctx, fmt.Sprintf("other-%d-%d", w, i), "test", 0, Metadata{}, New{Type: "X", Payload: payload{}})
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	evs, err := Load(ctx, s.Pool(), "ledger-k")
	if err != nil || len(evs) != 60 {
		t.Fatalf("%d events (%v), want 60", len(evs), err)
	}
	for i, e := range evs {
		if e.Version != int64(i+1) {
			t.Fatalf("event %d has version %d", i, e.Version)
		}
	}
	if v, _ := StreamVersion(ctx, s.Pool(), "ledger-k"); v != 60 {
		t.Fatalf("stream version %d", v)
	}
	if rep, err := Verify(ctx, s.Pool()); err != nil || rep.Tamper != nil {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// Verify reads one snapshot: a log that grows while it walks reads as intact, not as
// an event past the chain head.
func TestVerifyWhileAppending(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	for i := range 2500 { // more than one page of the walk
		if err := appendOne(ctx, s, fmt.Sprintf("pre-%d", i%50), int64(i/50), i); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	appended := make(chan int)
	go func() {
		n := 0
		defer func() { appended <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := appendOne(ctx, s, "live", int64(n), n); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	for range 5 {
		rep, err := Verify(ctx, s.Pool())
		if err != nil || rep.Tamper != nil {
			close(stop)
			<-appended
			t.Fatalf("verify while appending: %+v %v", rep.Tamper, err)
		}
	}
	close(stop)
	if n := <-appended; n == 0 {
		t.Fatal("nothing was appended while verify ran")
	}
}
