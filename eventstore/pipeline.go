package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
}

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
	if cur.conn == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		cur.conn = conn
	}
	return cur.conn, func(failed bool) {
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
// messages and COMMIT. The statements must succeed for the appends to stand: one that
// would not (a refused charge) raises serialization_failure. If anything is not as
// assumed, the whole transaction rolls back and Fast returns ErrStale.
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
	queue(b)
	// The guarded move of the head goes first, so that its lock comes before the
	// streams', as in every other append.
	last := chain(evs, cur.head, cur.hash)
	b.Queue(`SELECT advance_chain($1, $2, $3, $4)`, cur.head, cur.hash, last.Position, last.Hash)
	b.Queue(`SELECT advance_streams($1, $2, $3, $4)`, moves.ids, moves.types, moves.from, moves.to)
	queueInsert(b, evs)
	if err := queuePublish(ctx, b, evs); err != nil {
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
		return nil, err
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("eventstore: fast append did not commit")
	}
	versions := make(map[string]int64, len(moves.ids))
	for i, id := range moves.ids {
		versions[id] = moves.to[i]
	}
	cur.remember(last.Position, last.Hash, versions)
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
// round trip carries the events, their bus messages, the streams' new versions and
// COMMIT. The head's lock is taken after the caller's statements, as in Transact, so
// both keep one lock order.
//
// Like Transact, it runs again (queue included) when PostgreSQL reports a
// serialization failure or a deadlock, or a stream moved on meanwhile.
//
// cur, if not nil, is left remembering the head and the streams' versions.
func (s *Store) Pipelined(ctx context.Context, cur *Cursor, streams []string, queue func(*pgx.Batch), read func(pgx.BatchResults) ([]Appends, error)) ([]Event, error) {
	return retry(ctx, func() ([]Event, error) { return s.pipelinedOnce(ctx, cur, streams, queue, read) })
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
		return nil, fmt.Errorf("write events: %w", err)
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("eventstore: pipelined transaction did not commit")
	}
	last := evs[len(evs)-1]
	cur.remember(last.Position, last.Hash, version) // the versions once this commits
	return evs, nil
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
