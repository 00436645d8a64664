package eventstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

// Appends are the events a pipelined transaction appends to one stream, after whatever
// the stream holds (like AnyVersion).
type Appends struct {
	StreamID, StreamType string
	Events               []New
}

// Cursor is one hot writer's state: the chain's head and some streams' versions as its
// last append left them, so that its next append can go out in one round trip (Fast),
// and a connection of its own. Its own connection stays warm (statements prepared,
// PL/pgSQL compiled, caches filled), where one taken from the pool per call is often
// one another caller last used. A Cursor belongs to one writer and is not safe for
// concurrent use; Close gives its connection back.
type Cursor struct {
	known    bool
	head     int64
	hash     []byte
	versions map[string]int64
	conn     *pgxpool.Conn
	used     time.Time // when conn last ended a round trip
}

// idlePing is how long a cursor's connection may sit unused before it is pinged
// before use, as the pool does with its own: one that died meanwhile (the database
// restarted) is replaced rather than failing a transaction.
const idlePing = time.Second

// Close gives the cursor's connection back to the pool.
func (c *Cursor) Close() {
	if c.conn != nil {
		c.conn.Release()
		c.conn = nil
	}
}

// acquire returns the cursor's connection (a pool connection when cur is nil) and the
// function that ends its use: a connection that failed or is left in a transaction is
// released, which makes the pool close it, and the cursor takes a new one next time.
func (s *Store) acquire(ctx context.Context, cur *Cursor) (*pgxpool.Conn, func(failed bool), error) {
	if cur == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return conn, func(bool) { conn.Release() }, nil
	}
	if cur.conn != nil && time.Since(cur.used) > idlePing {
		if err := cur.conn.Ping(ctx); err != nil {
			cur.known = false
			cur.Close()
		}
	}
	if cur.conn == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		cur.conn = conn
	}
	return cur.conn, func(failed bool) {
		cur.used = time.Now()
		if failed || cur.conn.Conn().IsClosed() || cur.conn.Conn().PgConn().TxStatus() != 'I' {
			cur.known = false
			cur.Close()
		}
	}, nil
}

// maxRemembered bounds the versions a Cursor keeps; past it, it forgets them all.
const maxRemembered = 100_000

func (c *Cursor) remember(head int64, hash []byte, versions map[string]int64) {
	if c == nil {
		return
	}
	if c.versions == nil || len(c.versions) > maxRemembered {
		c.versions = map[string]int64{}
	}
	c.known, c.head, c.hash = true, head, hash
	for id, v := range versions {
		c.versions[id] = v
	}
}

// ErrStale says a fast append found the chain, a stream or a statement's outcome other
// than assumed; it wrote nothing, and the caller should take the pipelined path.
var ErrStale = errors.New("eventstore: fast append not as assumed")

// Fast appends in one round trip: BEGIN, the statements queue adds, the move of the
// chain's head and of the streams from where cur remembers them, the events, their bus
// messages or inline rows and COMMIT. The statements must succeed for the appends to
// stand: one that would not (a refused charge) raises serialization_failure. If
// anything is not as assumed, the whole transaction rolls back and Fast returns
// ErrStale. Events an inline projection refuses (ErrRefused) are refused before
// anything is sent. When the connection fails, the outcome is open (COMMIT went out
// with the rest): Fast returns an *UncertainCommitError, which the caller settles
// (Settle) when it can.
func (s *Store) Fast(ctx context.Context, cur *Cursor, queue func(*pgx.Batch), appends []Appends) (evs []Event, err error) {
	if !cur.known {
		return nil, ErrStale
	}
	evs, moves, err := encodeAppends(appends, s.now(), func(id string) (int64, error) {
		v, ok := cur.versions[id]
		if !ok {
			return 0, ErrStale // never seen: it may exist
		}
		return v, nil
	})
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		return nil, ErrStale
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// before the caller's statements do their work: has anyone appended since?
	b.Queue(`SELECT chain_at($1)`, cur.head)
	queue(b)
	// The guarded move of the head goes first, so that its lock comes before the
	// streams', as in every other append.
	last := chain(evs, cur.head, cur.hash)
	b.Queue(`SELECT advance_chain($1, $2, $3, $4)`, cur.head, cur.hash, last.Position, last.Hash)
	b.Queue(`SELECT advance_streams($1, $2, $3, $4)`, moves.ids, moves.types, moves.from, moves.to)
	queueInsert(b, evs)
	if err := queueDeliver(ctx, b, evs); err != nil {
		return nil, err
	}
	b.Queue("COMMIT")

	conn, done, err := s.acquire(ctx, cur)
	if err != nil {
		return nil, err
	}
	defer func() { done(err != nil && !errors.Is(err, ErrStale)) }()
	if err = conn.SendBatch(ctx, b).Close(); err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			conn.Exec(context.WithoutCancel(ctx), "ROLLBACK") //nolint:errcheck // the first error is the one to report
		}
		cur.known = false
		if postgres.IsRetryable(err) {
			return nil, ErrStale
		}
		return nil, uncertain(err, conn.Conn().PgConn(), last)
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("eventstore: fast append did not commit")
	}
	versions := make(map[string]int64, len(moves.ids))
	for i, id := range moves.ids {
		versions[id] = moves.to[i]
	}
	cur.remember(last.Position, last.Hash, versions)
	s.awaitWatchers(ctx, evs)
	return evs, nil
}

// Pipelined runs a transaction in two round trips, for hot paths whose statements can
// all be sent before any result is read (the ledger's batched charges). A Transact
// that appends takes five: BEGIN, the caller's statements, the chain's head, the
// events, COMMIT; on an idle server every one of them also wakes a sleeping process.
//
// The first round trip carries BEGIN, the statements queue adds, the lock on the
// chain's head and the versions of streams (every stream read may append to). read
// then takes the statements' results, in order, and returns the appends. The second
// round trip carries the events, their bus messages or inline rows, the streams' new
// versions and COMMIT. The head's lock is taken after the caller's statements, as in
// Transact, so both keep one lock order.
//
// Like Transact, it runs again (queue included) when PostgreSQL reports a
// serialization failure or a deadlock, or a stream moved on meanwhile.
//
// cur, if not nil, is left remembering the head and the streams' versions. When the
// connection fails during the second round trip (which carries COMMIT), Pipelined
// returns an *UncertainCommitError, which the caller settles (Settle) when it can.
func (s *Store) Pipelined(ctx context.Context, cur *Cursor, streams []string, queue func(*pgx.Batch), read func(pgx.BatchResults) ([]Appends, error)) ([]Event, error) {
	evs, err := retry(ctx, func() ([]Event, error) { return s.pipelinedOnce(ctx, cur, streams, queue, read) })
	if err == nil {
		s.awaitWatchers(ctx, evs)
	}
	return evs, err
}

func (s *Store) pipelinedOnce(ctx context.Context, cur *Cursor, streams []string, queue func(*pgx.Batch), read func(pgx.BatchResults) ([]Appends, error)) (evs []Event, err error) {
	conn, done, err := s.acquire(ctx, cur)
	if err != nil {
		return nil, err
	}
	// A connection left inside a transaction is closed by the pool on release, so an
	// error anywhere below cannot leak a half-done transaction to the next user.
	defer func() {
		if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
			conn.Exec(context.WithoutCancel(ctx), "ROLLBACK") //nolint:errcheck // the first error is the one to report
		}
		done(err != nil && !errors.Is(err, ErrConcurrency) && !postgres.IsRetryable(err))
	}()

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	queue(b)
	b.Queue(`SELECT position, hash FROM event_chain FOR UPDATE`)
	b.Queue(`SELECT stream_id, version FROM streams WHERE stream_id = ANY($1)`, streams)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("begin: %w", err)
	}
	appends, err := read(br)
	if err != nil {
		br.Close()
		return nil, err
	}
	var head int64
	var prev []byte
	if err := br.QueryRow().Scan(&head, &prev); err != nil {
		br.Close()
		return nil, fmt.Errorf("lock chain head: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, fmt.Errorf("stream versions: %w", err)
	}
	version := make(map[string]int64, len(streams))
	for _, id := range streams {
		version[id] = 0 // absent until read
	}
	for rows.Next() {
		var id string
		var v int64
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			br.Close()
			return nil, err
		}
		version[id] = v
	}
	rows.Close()
	if err := br.Close(); err != nil {
		return nil, err
	}

	// Every writer of these streams' versions holds the chain's head while it does
	// (AnyVersion appends take them at flush), so what was read stays true;
	// advance_streams still fails the transaction if a stream moved.
	evs, moves, err := encodeAppends(appends, s.now(), func(id string) (int64, error) {
		v, ok := version[id]
		if !ok {
			return 0, fmt.Errorf("eventstore: append to %s, which the pipelined transaction did not read", id)
		}
		return v, nil
	})
	if err != nil {
		return nil, err
	}
	for i, id := range moves.ids {
		version[id] = moves.to[i] // what the streams hold once this commits
	}
	if len(evs) == 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return nil, err
		}
		cur.remember(head, prev, version)
		return nil, nil
	}
	b = &pgx.Batch{}
	b.Queue(`SELECT advance_streams($1, $2, $3, $4)`, moves.ids, moves.types, moves.from, moves.to)
	if err := queueWrite(ctx, b, evs, head, prev); err != nil {
		return nil, err
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	if err := br.Close(); err != nil {
		return nil, uncertain(fmt.Errorf("write events: %w", err), conn.Conn().PgConn(), &evs[len(evs)-1])
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("eventstore: pipelined transaction did not commit")
	}
	last := evs[len(evs)-1]
	cur.remember(last.Position, last.Hash, version) // the versions once this commits
	return evs, nil
}

// ErrNotCommitted says a transaction whose connection failed at COMMIT proved, once
// asked, not to have committed: nothing it wrote stands. The error wraps it together with
// the connection's own error.
var ErrNotCommitted = errors.New("eventstore: the transaction did not commit")

// SettleWait bounds how long the outcome of a commit whose connection failed is asked
// for (while the database is away) before it is reported as unknown.
const SettleWait = 30 * time.Second

// UncertainCommitError says the connection failed once COMMIT may have been sent: the
// transaction may or may not have committed. Settle finds out which.
type UncertainCommitError struct {
	Err      error  // the connection's error
	pid      uint32 // the transaction's backend
	position int64  // where its last event would be
	hash     []byte // and that event's hash, which names the transaction's whole content
}

func (e *UncertainCommitError) Error() string {
	return "eventstore: commit outcome unknown: " + e.Err.Error()
}

func (e *UncertainCommitError) Unwrap() error { return e.Err }

// uncertain turns err, returned by a round trip that carried COMMIT, into an
// *UncertainCommitError when it leaves the outcome open: the connection failed or the
// server went away. A statement's own error (a constraint, a conflict) is definite: the
// transaction did not commit, and err is returned as it is.
func uncertain(err error, conn *pgconn.PgConn, last *Event) error {
	var pgErr *pgconn.PgError
	if err == nil || last == nil || (errors.As(err, &pgErr) && !postgres.IsUnavailable(err)) {
		return err
	}
	// Not even pgconn.SafeToRetry is proof that COMMIT was not sent: a connection the
	// server closed while pgx flushed the COMMIT reports "conn closed", which it calls
	// safe to retry.
	return &UncertainCommitError{Err: err, pid: conn.PID(), position: last.Position, hash: last.Hash}
}

// Settle finds out whether the transaction of an *UncertainCommitError committed. Its
// backend, if it still runs, is stopped and waited for first: a backend can still
// commit after its client lost it (the COMMIT may sit unread in its socket), and once
// it is gone its transaction has committed or never will. Then the log says: the
// transaction committed if and only if its last event is at its position with its
// hash. Settle asks until the database answers or ctx ends.
//
// The backend is found by process id; after a restart of the server that id may belong
// to a new backend (of this same role), which is then stopped too: its user sees a
// dropped connection, which it already copes with.
func (s *Store) Settle(ctx context.Context, u *UncertainCommitError) (committed bool, err error) {
	wait := 50 * time.Millisecond
	for {
		committed, err = s.settleOnce(ctx, u)
		if err == nil {
			return committed, nil
		}
		if s.logger != nil {
			s.logger.Warn("settling an uncertain commit", "position", u.position, "err", err)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("settle commit at position %d: %w", u.position, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func (s *Store) settleOnce(ctx context.Context, u *UncertainCommitError) (bool, error) {
	var alive int
	// pg_terminate_backend waits (up to 5 s) for the backend to exit.
	err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity WHERE pid = $1 AND pid <> pg_backend_pid()`, int32(u.pid)).Scan(&alive)
	if err != nil {
		return false, err
	}
	if alive > 0 {
		return false, fmt.Errorf("backend %d of the uncertain commit still runs", u.pid)
	}
	var hash []byte
	err = s.pool.QueryRow(ctx, `SELECT hash FROM events WHERE position = $1`, u.position).Scan(&hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return bytes.Equal(hash, u.hash), nil
}

func lastEvent(evs []Event) *Event {
	if len(evs) == 0 {
		return nil
	}
	return &evs[len(evs)-1]
}

// settled is what a caller that waits for its own transaction reports after COMMIT
// failed with err: the events if it committed after all, ErrNotCommitted if it did not,
// and err itself while nobody can say (ctx ended, or the database stayed away for
// SettleWait).
func (s *Store) settled(ctx context.Context, err error, evs []Event) ([]Event, error) {
	var u *UncertainCommitError
	if !errors.As(err, &u) {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, SettleWait)
	defer cancel()
	committed, serr := s.Settle(ctx, u)
	switch {
	case serr != nil:
		return nil, err
	case committed:
		return evs, nil
	default:
		return nil, fmt.Errorf("%w (%w)", ErrNotCommitted, u.Err)
	}
}

// streamMoves are the streams an append moves, from which version to which.
type streamMoves struct {
	ids, types []string
	from, to   []int64
}

// encodeAppends turns appends into events after each stream's current version, which
// current gives.
func encodeAppends(appends []Appends, now time.Time, current func(streamID string) (int64, error)) ([]Event, streamMoves, error) {
	var evs []Event
	var m streamMoves
	for _, a := range appends {
		if len(a.Events) == 0 {
			continue
		}
		v, err := current(a.StreamID)
		if err != nil {
			return nil, m, err
		}
		m.ids, m.types, m.from = append(m.ids, a.StreamID), append(m.types, a.StreamType), append(m.from, v)
		for _, e := range a.Events {
			v++
			ev, err := encode(a.StreamID, a.StreamType, v, Metadata{}, e, now)
			if err != nil {
				return nil, m, err
			}
			evs = append(evs, ev)
		}
		m.to = append(m.to, v)
	}
	return evs, m, nil
}
