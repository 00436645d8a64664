package eventstore

import (
	"chessd/postgres/pgtest"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"
)

func init() { RegisterWatched("watched") } // this package's tests' stand-in for keys and accounts

func appendWatched(ctx context.Context, s *Store, stream string) error {
	_, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		return tx.Append(ctx, stream, "watched", AnyVersion, Metadata{RequestID: "req"}, New{Type: "Changed", Payload: payload{1}})
	})
	return err
}

// trusted waits until w vouches for what is read from now on, and returns the mark.
func trusted(t *testing.T, w *Watcher) int64 {
	t.Helper()
	var m int64
	pgtest.WaitFor(t, "the watcher vouches", func() bool { m = w.Mark(); return w.Unchanged(m) })
	return m
}

func watchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func TestACommitReturnsOnceEveryWatcherHasSeenIt(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	servers := []*Watcher{Watch(ctx, s.pool, watchLogger()), Watch(ctx, s.pool, watchLogger())}
	marks := make([]int64, len(servers))
	for i, w := range servers {
		marks[i] = trusted(t, w)
	}
	for i := range 20 {
		stream := fmt.Sprintf("watched-%d", i)
		if err := appendWatched(ctx, s, stream); err != nil {
			t.Fatal(err)
		}
		for j, w := range servers {
			if w.Unchanged(marks[j], stream) {
				t.Fatalf("append %d returned before watcher %d had seen it", i, j)
			}
		}
	}
	// an unwatched stream type is not announced: a mark taken now still holds after it
	m := trusted(t, servers[0])
	if err := appendOne(ctx, s, "unwatched-1", 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := appendWatched(ctx, s, "watched-other"); err != nil {
		t.Fatal(err)
	}
	if !servers[0].Unchanged(m, "watched-0", "unwatched-1") {
		t.Fatal("a change to one stream made the watcher distrust others")
	}
}

func TestACommitWaitsOutAWatcherThatDoesNotAnswer(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	// a server that registered and then stopped answering (paused, cut off)
	if _, err := s.pool.Exec(ctx, `INSERT INTO stream_watchers VALUES ('silent', 0, now() + interval '30 seconds')`); err != nil {
		t.Fatal(err)
	}
	expired := func() bool {
		var done bool
		if err := s.pool.QueryRow(ctx, `SELECT valid_until <= now() FROM stream_watchers WHERE watcher = 'silent'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	}
	if err := appendOne(ctx, s, "unwatched-1", 0, 1); err != nil {
		t.Fatal(err)
	}
	if expired() {
		t.Fatal("an append to an unwatched stream waited for a watcher")
	}
	if _, err := s.pool.Exec(ctx, `UPDATE stream_watchers SET valid_until = now() + interval '300 milliseconds'`); err != nil {
		t.Fatal(err)
	}
	if err := appendWatched(ctx, s, "watched-1"); err != nil {
		t.Fatal(err)
	}
	if !expired() {
		t.Fatal("an append to a watched stream returned while a watcher that had not seen it could still vouch for its memory")
	}
}

// A committed change waits for the watchers whatever its caller's context does after
// the commit: a client that left as soon as it revoked a key must not leave another
// server answering from a memory older than the revocation.
func TestACommitWaitsForWatchersAfterItsCallerLeft(t *testing.T) {
	s := newStore(t)
	bg := context.Background()
	if _, err := s.pool.Exec(bg, `INSERT INTO stream_watchers VALUES ('silent', 0, now() + interval '1500 milliseconds')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond) // the caller leaves after the commit
	defer cancel()
	if err := appendWatched(ctx, s, "watched-1"); err != nil {
		t.Fatal(err)
	}
	var expired bool
	if err := s.pool.QueryRow(bg, `SELECT valid_until <= now() FROM stream_watchers WHERE watcher = 'silent'`).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if !expired {
		t.Fatal("the commit returned when its caller left, while a watcher that had not seen it could still vouch for its memory")
	}
}

func TestAWatcherThatLostItsConnectionVouchesForNothingReadBefore(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := Watch(ctx, s.pool, watchLogger())
	m := trusted(t, w)
	var killed int
	if err := s.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND position('LISTEN '||$1 IN query) > 0`, WatchChannel).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the watcher's connection: %d, %v", killed, err)
	}
	// the change lands while the watcher may be down: it waits for it or for its lease
	if err := appendWatched(ctx, s, "watched-1"); err != nil {
		t.Fatal(err)
	}
	if w.Unchanged(m, "watched-1") {
		t.Fatal("the watcher vouches for a read older than a change it may have missed")
	}
	trusted(t, w) // it listens again
	if w.Unchanged(m, "watched-1") {
		t.Fatal("back, the watcher vouches for a read older than a change")
	}
}

func TestParseAnnouncement(t *testing.T) {
	tests := []struct {
		in     string
		pos    int64
		stream string
		ok     bool
	}{
		{"42 key-abc", 42, "key-abc", true},
		{"1 account-x y", 1, "account-x y", true},
		{"42", 0, "", false},
		{"42 ", 0, "", false},
		{"x key-abc", 0, "", false},
		{"0 key-abc", 0, "", false},
		{"-3 key-abc", 0, "", false},
		{"", 0, "", false},
	}
	for _, tt := range tests {
		pos, stream, ok := parseAnnouncement(tt.in)
		if ok != tt.ok || (ok && (pos != tt.pos || stream != tt.stream)) {
			t.Errorf("parseAnnouncement(%q) = %d, %q, %v; want %d, %q, %v", tt.in, pos, stream, ok, tt.pos, tt.stream, tt.ok)
		}
	}
}

// FuzzParseAnnouncement: an announcement is read back as written, and anything else is
// refused, never misread or a panic.
func FuzzParseAnnouncement(f *testing.F) {
	f.Add("42 key-abc")
	f.Add("1 account-acct_0123")
	f.Add(" 42 key")
	f.Add("9223372036854775808 key-x")
	f.Fuzz(func(t *testing.T, s string) {
		pos, stream, ok := parseAnnouncement(s)
		if !ok {
			return
		}
		if pos <= 0 || stream == "" {
			t.Fatalf("%q read as %d, %q", s, pos, stream)
		}
		if again := fmt.Sprintf("%d %s", pos, stream); again != s {
			if p2, s2, ok2 := parseAnnouncement(again); !ok2 || p2 != pos || s2 != stream {
				t.Fatalf("%q read as %d %q, which reads back as %d %q %v", s, pos, stream, p2, s2, ok2)
			}
		}
	})
}

// Under concurrent changes, and with the watcher's connection cut now and then, it
// never vouches for a read that a change returned after: every change that had
// returned before a check began has a position the read saw.
func TestAWatcherNeverVouchesForAReadAChangeOutdated(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := Watch(ctx, s.pool, watchLogger())
	trusted(t, w)
	const streams = 4
	var mu sync.Mutex
	returned := map[string]int64{} // stream -> position of the last change that returned
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for i := range 3 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := fmt.Sprintf("watched-%d", (i+n)%streams)
				evs, err := s.Transact(ctx, func(ctx context.Context, tx *Tx) error {
					return tx.Append(ctx, stream, "watched", AnyVersion, Metadata{RequestID: "req"}, New{Type: "Changed", Payload: payload{n}})
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				returned[stream] = max(returned[stream], evs[0].Position)
				mu.Unlock()
			}
		}()
	}
	cuts := 0
	vouched, checks := 0, 0
	for start := time.Now(); time.Since(start) < 4*time.Second; {
		stream := fmt.Sprintf("watched-%d", checks%streams)
		mark := w.Mark()
		var read int64 // what a reader of the stream's state saw
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM events WHERE stream_id = $1`, stream).Scan(&read); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(checks%3) * time.Millisecond)
		mu.Lock()
		before := returned[stream] // changes that returned before the check
		mu.Unlock()
		if w.Unchanged(mark, stream) {
			vouched++
			if before > read {
				t.Fatalf("check %d: the watcher vouched for a read of %s at position %d after a change at %d had returned", checks, stream, read, before)
			}
		}
		checks++
		if checks%500 == 0 && cuts < 3 {
			cuts++
			s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND position('LISTEN '||$1 IN query) > 0`, WatchChannel) //nolint:errcheck // checked by what follows
		}
	}
	close(stop)
	writers.Wait()
	if vouched == 0 || vouched == checks {
		t.Fatalf("the watcher vouched for %d of %d reads: the test proves nothing", vouched, checks)
	}
	t.Logf("%d checks, %d vouched for, %d connections cut", checks, vouched, cuts)
}
