package eventstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A server that keeps some aggregates in memory (keys and accounts, for
// authentication) must see every change to them on its next call, whichever server
// made the change. Reading their streams' versions on every call costs a round trip
// before any work can start. A Watcher replaces that read by a promise the database
// keeps for it:
//   - every append to a watched stream type is announced on WatchChannel at commit,
//     with its position; positions follow commit order (the chain's head is locked
//     until commit) and so do notifications, so "seen up to position p" is one number;
//   - the watcher writes that number to its row of stream_watchers, with a lease;
//   - a transaction that appended to a watched stream returns only once every watcher
//     whose lease is still valid has seen its position (or let its lease run out).
//
// A watcher trusts what it read after a mark while its lease holds, by its own clock
// with a margin, and no announcement for the streams concerned came after the mark.
// When it stops listening or cannot renew its lease, it trusts nothing read before it
// listens and renews again: its callers read the versions, as without a watcher.

// WatchChannel carries "position stream_id" for each event of a watched stream type,
// delivered at commit.
const WatchChannel = "chessd_streams"

const (
	watchLease  = 2 * time.Second        // a watcher's row is valid this long after it writes it
	watchRenew  = 500 * time.Millisecond // and it writes it at least this often
	watchMargin = 500 * time.Millisecond // it stops trusting this long before its row expires, by its own clock
	maxChanged  = 100_000                // streams remembered as changed; past it, every mark before is distrusted
	maxAwait    = 10 * time.Second       // a commit never waits longer than this for watchers
)

// watched holds the stream types whose appends watchers are told of.
var watched = map[string]bool{}

// RegisterWatched makes streamType's appends announced to watchers, and makes each
// transaction that appends to one wait until every watcher has seen it. Call it from an
// init function of the package that keeps such aggregates in memory.
func RegisterWatched(streamType string) { watched[streamType] = true }

// queueAnnounce announces, at commit, the events of evs on watched streams.
func queueAnnounce(batch *pgx.Batch, evs []Event) {
	var notes []string
	for i := range evs {
		if watched[evs[i].StreamType] {
			notes = append(notes, strconv.FormatInt(evs[i].Position, 10)+" "+evs[i].StreamID)
		}
	}
	if len(notes) > 0 {
		batch.Queue(`SELECT pg_notify($1, n) FROM unnest($2::text[]) n`, WatchChannel, notes)
	}
}

// lastWatched is the position of the last event of evs on a watched stream, 0 for none.
func lastWatched(evs []Event) int64 {
	var last int64
	for i := range evs {
		if watched[evs[i].StreamType] {
			last = max(last, evs[i].Position)
		}
	}
	return last
}

// awaitWatchers returns once every watcher whose lease is valid has seen the watched
// events of evs (committed), or its lease has run out: from then on no server answers
// from a memory older than them. When it cannot tell (the database is unreachable), it
// waits out a whole lease. The change is committed: its caller leaving (ctx ended)
// does not end the wait, which maxAwait bounds (and a lease past it, its queries
// included: the loop's own check of maxAwait, which says so in the log, comes first).
func (s *Store) awaitWatchers(ctx context.Context, evs []Event) {
	pos := lastWatched(evs)
	if pos == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxAwait+watchLease)
	defer cancel()
	start := time.Now()
	delay := 500 * time.Microsecond
	for {
		var left *float64 // seconds until the last lagging watcher's lease runs out
		err := s.pool.QueryRow(ctx, `SELECT extract(epoch FROM max(valid_until) - now())::float8
			FROM stream_watchers WHERE seen < $1 AND valid_until > now()`, pos).Scan(&left)
		if err != nil {
			if ctx.Err() == nil && s.logger != nil {
				s.logger.Warn("cannot tell whether every server has seen a change; waiting out a lease", "position", pos, "err", err)
			}
			sleep(ctx, watchLease)
			return
		}
		if left == nil {
			return
		}
		if time.Since(start) > maxAwait {
			if s.logger != nil {
				s.logger.Error("a watcher renews its lease but does not see a change", "position", pos)
			}
			return
		}
		sleep(ctx, min(delay, time.Duration(*left*float64(time.Second))+time.Millisecond))
		delay = min(2*delay, 20*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Watcher follows the announcements of watched streams for one process (see above).
type Watcher struct {
	id     string
	pool   *pgxpool.Pool
	logger *slog.Logger
	acks   chan struct{} // a notification was applied: write seen now

	mu        sync.RWMutex
	listening bool
	session   uint64           // counts the times trust was lost: a renewal that spans one is void
	seen      int64            // the last position applied (or the head when trust began)
	floor     int64            // marks below it are not trusted
	changed   map[string]int64 // stream -> position of its last announced event
	until     time.Time        // trust ends, by this process's clock
}

// Watch starts a watcher on pool's listener (Listen) until ctx ends; then its row is
// deleted, so that no commit waits for it.
func Watch(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) *Watcher {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // never fails (crypto/rand)
	w := &Watcher{id: hex.EncodeToString(b), pool: pool, logger: logger, acks: make(chan struct{}, 1), changed: map[string]int64{}}
	remove := acquireListener(ctx, pool, logger).addWatcher(w)
	context.AfterFunc(ctx, func() {
		remove()
		w.lapse(ctx)
	})
	go w.renewLoop(ctx)
	return w
}

// Mark is taken before a read whose result is to be trusted later (Unchanged).
func (w *Watcher) Mark() int64 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.seen
}

// Unchanged says whether what was read after mark still holds for streams: the
// watcher has been listening under a valid lease since, and none of streams was
// announced after mark. False means: read again.
func (w *Watcher) Unchanged(mark int64, streams ...string) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if !w.listening || mark < w.floor || !time.Now().Before(w.until) {
		return false
	}
	for _, s := range streams {
		if w.changed[s] > mark {
			return false
		}
	}
	return true
}

// begin is called once the listener listens: trust begins with the next renewal, which
// reads the head after LISTEN.
func (w *Watcher) begin() {
	w.mu.Lock()
	w.listening = true
	w.session++
	w.until = time.Time{}
	w.mu.Unlock()
	w.ack()
}

// distrust makes the next renewal begin again from the head, as after a lapse, while
// listening goes on (an announcement could not be read).
func (w *Watcher) distrust() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.session++ // a renewal in flight must not restore trust
	w.until = time.Time{}
}

func parseAnnouncement(s string) (int64, string, bool) {
	p, stream, ok := strings.Cut(s, " ")
	if !ok || stream == "" {
		return 0, "", false
	}
	pos, err := strconv.ParseInt(p, 10, 64)
	return pos, stream, err == nil && pos > 0
}

func (w *Watcher) apply(pos int64, stream string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.changed) >= maxChanged {
		clear(w.changed)
		w.floor = w.seen
	}
	w.changed[stream] = max(w.changed[stream], pos)
	w.seen = max(w.seen, pos)
}

// lapse ends trust until the listener listens and the watcher renews again, and
// deletes its row (best effort: otherwise it expires), so that commits stop waiting for
// it.
func (w *Watcher) lapse(ctx context.Context) {
	w.mu.Lock()
	w.listening = false
	w.session++
	w.until = time.Time{}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	w.pool.Exec(ctx, `DELETE FROM stream_watchers WHERE watcher = $1`, w.id) //nolint:errcheck // it expires anyway
}

func (w *Watcher) ack() {
	select {
	case w.acks <- struct{}{}:
	default:
	}
}

// renewLoop writes the watcher's row after each announcement and every watchRenew,
// while it listens.
func (w *Watcher) renewLoop(ctx context.Context) {
	tick := time.NewTicker(watchRenew)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.acks:
		case <-tick.C:
		}
		if err := w.renew(ctx); err != nil && ctx.Err() == nil {
			w.logger.Warn("stream watcher's lease not renewed", "err", err)
		}
	}
}

// renew writes seen and a new lease. When trust had ended (the watcher has just begun
// listening, or its lease ran out, by its clock or by the database's), it begins again
// from the chain's head: marks taken before are no longer trusted, since announcements
// may have been missed or a commit may have stopped waiting for this watcher.
func (w *Watcher) renew(ctx context.Context) error {
	w.mu.RLock()
	listening, seen, session := w.listening, w.seen, w.session
	restart := !time.Now().Before(w.until)
	w.mu.RUnlock()
	if !listening {
		return nil
	}
	sent := time.Now()
	var now int64
	var restarted bool
	err := w.pool.QueryRow(ctx, `WITH old AS (SELECT valid_until > now() AS valid FROM stream_watchers WHERE watcher = $1)
		INSERT INTO stream_watchers AS w (watcher, seen, valid_until)
		VALUES ($1, greatest($2, (SELECT position FROM event_chain)), now() + $4::float8 * interval '1 second')
		ON CONFLICT (watcher) DO UPDATE SET
			seen = CASE WHEN $3 OR w.valid_until <= now() THEN excluded.seen ELSE greatest(w.seen, $2) END,
			valid_until = excluded.valid_until
		RETURNING seen, $3 OR NOT coalesce((SELECT valid FROM old), false)`,
		w.id, seen, restart, watchLease.Seconds()).Scan(&now, &restarted)
	if err != nil {
		return fmt.Errorf("renew stream watcher: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.listening || w.session != session { // stopped listening meanwhile: announcements may be missing
		return nil
	}
	if restarted {
		w.seen = max(w.seen, now)
		w.floor = w.seen
		// rows of servers killed long ago: they bind no commit, only take room
		go w.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM stream_watchers WHERE valid_until < now() - interval '1 hour'`) //nolint:errcheck // next time
	}
	w.until = sent.Add(watchLease - watchMargin)
	return nil
}
