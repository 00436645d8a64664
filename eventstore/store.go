// Package eventstore is the append-only log of domain events in PostgreSQL.
//
// Guarantees (docs/ARCHITECTURE.md explains why):
//   - optimistic concurrency per stream: an append names the version it expects; a
//     conflicting append fails with *ConcurrencyError and writes nothing;
//   - a global position assigned in commit order without gaps, so a reader that follows
//     positions never skips an event that committed late;
//   - a hash chain: each event's hash covers its content and the previous event's hash;
//   - every appended event is published on the Watermill bus in the same transaction,
//     or, for a topic with an inline projection (RegisterInline), has that read model's
//     rows written in the same transaction instead.
package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	gojson "github.com/goccy/go-json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

// Metadata travels with every event: who caused it and why.
type Metadata struct {
	RequestID      string `json:"request_id,omitempty"`
	AccountID      string `json:"account_id,omitempty"`
	KeyID          string `json:"key_id,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	CausationID    string `json:"causation_id,omitempty"`
}

// Event is one stored event.
type Event struct {
	Position      int64           `json:"position"`
	StreamID      string          `json:"stream_id"`
	StreamType    string          `json:"stream_type"`
	Version       int64           `json:"version"`
	Type          string          `json:"type"`
	SchemaVersion int             `json:"schema_version"`
	Payload       json.RawMessage `json:"payload"`
	Metadata      json.RawMessage `json:"metadata"`
	RecordedAt    time.Time       `json:"recorded_at"`
	Hash          []byte          `json:"hash"`

	value any // what Payload was marshalled from, for an event appended by this process
}

// Value is what the event's payload was marshalled from when this process appended it
// (New.Payload), or nil for an event read back from the log: an inline projection
// writes its rows from it without decoding the JSON again.
func (e Event) Value() any { return e.value }

// Meta decodes the event's metadata.
func (e Event) Meta() Metadata {
	var m Metadata
	_ = json.Unmarshal(e.Metadata, &m) // written by us; an unreadable one is simply empty
	return m
}

// New is an event a command wants to append.
type New struct {
	Type          string
	SchemaVersion int
	Payload       any       // marshalled as JSON; not to be changed once appended
	Meta          *Metadata // this event's own metadata; nil: the Append call's
	// Encoded, when not nil, is Payload marshalled already (gojson.Marshal), by a caller
	// that can do it off a serial path: the ledger's calls encode their own line items,
	// beside each other, rather than in the settler's group commit. It must be what
	// marshalling Payload gives: it is what is stored and hashed, and Payload is what
	// inline projections read.
	Encoded []byte
}

// ConcurrencyError is returned when a stream's version is not the expected one.
type ConcurrencyError struct {
	StreamID string
	Expected int64
}

func (e *ConcurrencyError) Error() string {
	return fmt.Sprintf("stream %s: expected version %d, but it has moved on", e.StreamID, e.Expected)
}

// ErrConcurrency matches any *ConcurrencyError with errors.Is.
var ErrConcurrency = errors.New("concurrent append")

func (e *ConcurrencyError) Is(target error) bool { return target == ErrConcurrency }

// Store appends and reads events.
type Store struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
	now    func() time.Time
}

// Topics maps stream types to the Watermill topic their events are published on.
// Stream types not listed go to TopicDefault.
var Topics = map[string]string{
	"account": "accounts",
	"key":     "accounts",
	"email":   "accounts",
	"ledger":  "ledger",
	"job":     "jobs",
	"dispute": "disputes",
}

// TopicDefault is the topic of stream types Topics does not name.
const TopicDefault = "accounts"

// BusSchema is the Watermill schema of every topic table (payload stored as bytea,
// see migrations/0003_event_bus.sql).
var BusSchema = wmsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }}

// NewStore builds a store on pool.
func NewStore(pool *pgxpool.Pool, logger *slog.Logger) *Store {
	return &Store{
		pool:   pool,
		logger: logger,
		now:    func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
	}
}

// TopicOf is the bus topic of a stream type's events.
func TopicOf(streamType string) string {
	if topic, ok := Topics[streamType]; ok {
		return topic
	}
	return TopicDefault
}

// Pool is the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Tx is a transaction that can append events. Appends are checked against stream
// versions at once, and written to the log when the transaction commits.
type Tx struct {
	pgx.Tx
	store   *Store
	pending []Event
}

// Transact runs fn in a transaction and commits it with the events fn appended. When a
// stream moved on meanwhile (or PostgreSQL reports a serialization failure) fn runs again
// on fresh state, up to a few times; the final error is returned otherwise.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) ([]Event, error) {
	evs, err := retry(ctx, func() ([]Event, error) { return s.transactOnce(ctx, fn) })
	if err == nil {
		s.awaitWatchers(ctx, evs)
	}
	return evs, err
}

// retry runs once a few times while it fails because a stream moved on or PostgreSQL
// reports a serialization failure or deadlock.
func retry(ctx context.Context, once func() ([]Event, error)) ([]Event, error) {
	const attempts = 5
	var err error
	for i := 0; i < attempts; i++ {
		var evs []Event
		evs, err = once()
		if err == nil {
			return evs, nil
		}
		if !errors.Is(err, ErrConcurrency) && !postgres.IsRetryable(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, err
}

func (s *Store) transactOnce(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) (evs []Event, err error) {
	pgtx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			pgtx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // panicking anyway
			panic(p)
		}
		if err != nil {
			pgtx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the first error is the one to report
		}
	}()
	tx := &Tx{Tx: pgtx, store: s}
	if err := fn(ctx, tx); err != nil {
		return nil, err
	}
	if err := tx.flush(ctx); err != nil {
		return nil, err
	}
	if testHookBeforeCommit != nil {
		testHookBeforeCommit(tx)
	}
	if err := pgtx.Commit(ctx); err != nil {
		// The connection may have failed with the commit done: find out (pipeline.go).
		err = uncertain(fmt.Errorf("commit: %w", err), pgtx.Conn().PgConn(), lastEvent(tx.pending))
		return s.settled(ctx, err, tx.pending)
	}
	return tx.pending, nil
}

// AnyVersion appends whatever the stream's version, for streams whose events are
// independent facts guarded elsewhere (a ledger stream is guarded by the balance rows).
const AnyVersion int64 = -1

// testHookBeforeCommit lets tests hold a transaction between writing its events and
// committing them, the window in which a follower must not skip ahead.
var testHookBeforeCommit func(*Tx)

// Append checks that stream is at version expected (0: the stream must not exist yet),
// then queues evs as its next versions. The stream's row stays locked until the
// transaction ends, so a concurrent append with the same expectation waits, then fails.
func (tx *Tx) Append(ctx context.Context, streamID, streamType string, expected int64, md Metadata, evs ...New) error {
	if len(evs) == 0 {
		return nil
	}
	n := int64(len(evs))
	var tag pgconn.CommandTag
	var err error
	if expected == AnyVersion {
		// No decision rests on the stream's state: the versions are taken at flush,
		// in the same round trip as the chain's head.
		tag = pgconn.NewCommandTag("UPDATE 1")
	} else if expected == 0 {
		tag, err = tx.Exec(ctx, `INSERT INTO streams (stream_id, stream_type, version) VALUES ($1, $2, $3)
			ON CONFLICT (stream_id) DO NOTHING`, streamID, streamType, n)
	} else {
		tag, err = tx.Exec(ctx, `UPDATE streams SET version = version + $3
			WHERE stream_id = $1 AND version = $2`, streamID, expected, n)
	}
	if err != nil {
		return fmt.Errorf("append to %s: %w", streamID, err)
	}
	if tag.RowsAffected() != 1 {
		return &ConcurrencyError{StreamID: streamID, Expected: expected}
	}
	now := tx.store.now()
	for i, e := range evs {
		version := expected + int64(i) + 1
		if expected == AnyVersion {
			version = -tx.queued(streamID) // 0, -1, -2...: resolved by lockHead
		}
		ev, err := encode(streamID, streamType, version, md, e, now)
		if err != nil {
			return err
		}
		tx.pending = append(tx.pending, ev)
	}
	return nil
}

// encode turns a new event into the row it will be, short of its position and hash.
// goccy/go-json writes the JSON encoding/json does (the same values, numbers digit for
// digit; it escapes \b and \f as \u0008 and \u000c: FuzzEncodeEvents in ledger checks
// every registered event), faster: every charge is one event. The chain hashes the
// stored text, whichever wrote it.
func encode(streamID, streamType string, version int64, md Metadata, e New, now time.Time) (Event, error) {
	m := &md
	if e.Meta != nil {
		m = e.Meta
	}
	meta, err := gojson.Marshal(m)
	if err != nil {
		return Event{}, err
	}
	payload := e.Encoded
	if payload == nil {
		if payload, err = gojson.Marshal(e.Payload); err != nil {
			return Event{}, fmt.Errorf("encode %s: %w", e.Type, err)
		}
	}
	sv := e.SchemaVersion
	if sv == 0 {
		sv = 1
	}
	return Event{
		StreamID: streamID, StreamType: streamType, Version: version,
		Type: e.Type, SchemaVersion: sv, Payload: payload, Metadata: meta, RecordedAt: now, value: e.Payload,
	}, nil
}

// queued counts the AnyVersion events of stream already pending.
func (tx *Tx) queued(stream string) int64 {
	var n int64
	for _, e := range tx.pending {
		if e.StreamID == stream && e.Version <= 0 {
			n++
		}
	}
	return n
}

// flush writes the pending events at the head of the chain. It takes the chain's row
// lock, which is held until commit: this is what makes positions follow commit order.
// It runs last, so the lock is held only for these few statements and the commit.
func (tx *Tx) flush(ctx context.Context) error {
	if len(tx.pending) == 0 {
		return nil
	}
	var head int64
	var prev []byte
	if err := tx.lockHead(ctx, &head, &prev); err != nil {
		return err
	}
	batch := &pgx.Batch{}
	if err := queueWrite(ctx, batch, tx.pending, head, prev); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("write events: %w", err)
	}
	return nil
}

// queueWrite gives evs the positions after head, chains their hashes from prev, and
// queues their insert, the chain head's update and their bus messages or inline rows
// on batch.
func queueWrite(ctx context.Context, batch *pgx.Batch, evs []Event, head int64, prev []byte) error {
	last := chain(evs, head, prev)
	queueInsert(batch, evs)
	batch.Queue(`UPDATE event_chain SET position = $1, hash = $2`, last.Position, last.Hash)
	return queueDeliver(ctx, batch, evs)
}

// chain gives evs the positions after head and their hashes, chained from prev; it
// returns the last one.
func chain(evs []Event, head int64, prev []byte) *Event {
	for i := range evs {
		e := &evs[i]
		e.Position = head + int64(i) + 1
		e.Hash = ChainHash(prev, e)
		prev = e.Hash
	}
	return &evs[len(evs)-1]
}

// queueInsert queues the insert of chained events.
func queueInsert(batch *pgx.Batch, evs []Event) {
	cols := struct {
		pos, ver             []int64
		stream, stype, etype []string
		sv                   []int32
		payload, meta        []string
		at                   []time.Time
		hash                 [][]byte
	}{}
	for i := range evs {
		e := &evs[i]
		cols.pos = append(cols.pos, e.Position)
		cols.ver = append(cols.ver, e.Version)
		cols.stream = append(cols.stream, e.StreamID)
		cols.stype = append(cols.stype, e.StreamType)
		cols.etype = append(cols.etype, e.Type)
		cols.sv = append(cols.sv, int32(e.SchemaVersion))
		cols.payload = append(cols.payload, string(e.Payload))
		cols.meta = append(cols.meta, string(e.Metadata))
		cols.at = append(cols.at, e.RecordedAt)
		cols.hash = append(cols.hash, e.Hash)
	}
	queueAnnounce(batch, evs)
	batch.Queue(`INSERT INTO events (position, stream_id, stream_type, version, event_type,
			schema_version, payload, metadata, recorded_at, hash)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[],
			$6::int[], $7::json[], $8::json[], $9::timestamptz[], $10::bytea[])`,
		cols.pos, cols.stream, cols.stype, cols.ver, cols.etype, cols.sv, cols.payload, cols.meta, cols.at, cols.hash)
}

// lockHead locks and reads the chain's head and, in the same round trip, takes the
// versions of AnyVersion appends (their events were queued with Version 0, 1, 2...
// relative to the stream's unknown current version).
func (tx *Tx) lockHead(ctx context.Context, head *int64, prev *[]byte) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT position, hash FROM event_chain FOR UPDATE`)
	counts := map[string]int64{}
	var streams []string
	types := map[string]string{}
	for _, e := range tx.pending {
		if e.Version > 0 {
			continue
		}
		if _, ok := counts[e.StreamID]; !ok {
			streams = append(streams, e.StreamID)
		}
		counts[e.StreamID]++
		types[e.StreamID] = e.StreamType
	}
	for _, id := range streams {
		b.Queue(`INSERT INTO streams (stream_id, stream_type, version) VALUES ($1, $2, $3)
			ON CONFLICT (stream_id) DO UPDATE SET version = streams.version + excluded.version
			RETURNING version`, id, types[id], counts[id])
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if err := br.QueryRow().Scan(head, prev); err != nil {
		return fmt.Errorf("lock chain head: %w", err)
	}
	base := map[string]int64{}
	for _, id := range streams {
		var last int64
		if err := br.QueryRow().Scan(&last); err != nil {
			return fmt.Errorf("append to %s: %w", id, err)
		}
		base[id] = last - counts[id]
	}
	for i := range tx.pending {
		e := &tx.pending[i]
		if b, ok := base[e.StreamID]; ok && e.Version <= 0 {
			e.Version = b + 1 - e.Version // queued as 0, -1, -2...: the 1st, 2nd, 3rd new version
		}
	}
	return br.Close()
}

// InlineFunc queues on b the rows an inline projection derives from evs: chained
// events (positions and hashes given) of its topic, in position order, all appended by
// one transaction. An error refuses the events: the transaction writes nothing.
type InlineFunc func(b *pgx.Batch, evs []Event) error

// TableRows are rows of one table of an inline projection's read model, for COPY into
// an empty copy of the table (a rebuild).
type TableRows struct {
	Table   string
	Columns []string
	Rows    []byte // in COPY's binary format (postgres.CopyRows), its columns in Columns' order
	N       int    // how many rows
}

// inline holds the inline projections by topic. Registered at init (the package that
// owns the read model registers it), so every Store of the process, whoever built it,
// writes the same read models: none can append a topic's events without their rows.
var inline = map[string]InlineFunc{}

// RegisterInline makes the read model of topic an inline projection: every transaction
// that appends events of topic queues their rows (queue) in the same round trip as the
// events, and no bus message is published for them. Call it from an init function.
func RegisterInline(topic string, queue InlineFunc) {
	if _, dup := inline[topic]; dup {
		panic("eventstore: inline projection of " + topic + " registered twice")
	}
	inline[topic] = queue
}

// Inlined reports whether topic's read model is written inline (RegisterInline): it is
// never behind the log, and topic gets no bus messages.
func Inlined(topic string) bool {
	_, ok := inline[topic]
	return ok
}

// ErrRefused says an inline projection refused an event (its rows could not be made):
// the transaction that appended it wrote nothing.
var ErrRefused = errors.New("eventstore: an inline projection refused the event")

// queueDeliver queues, inside this transaction, each event's delivery to its readers:
// the rows of an inline projection, or a message on the Watermill bus, so a subscriber
// sees it exactly when it is committed. The bus insert is built by watermill-sql's own
// schema adapter (what its Publisher runs). Both go in the same round trip as the
// events, which matters while the chain's lock is held.
func queueDeliver(ctx context.Context, batch *pgx.Batch, evs []Event) error {
	byTopic := map[string][]Event{}
	var order []string
	for _, e := range evs {
		topic := TopicOf(e.StreamType)
		if _, ok := byTopic[topic]; !ok {
			order = append(order, topic)
		}
		byTopic[topic] = append(byTopic[topic], e)
	}
	for _, topic := range order {
		if queue, ok := inline[topic]; ok {
			if err := queue(batch, byTopic[topic]); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrRefused, topic, err)
			}
			continue
		}
		if err := queuePublish(ctx, batch, topic, byTopic[topic]); err != nil {
			return err
		}
	}
	return nil
}

// queuePublish puts evs on topic's bus table and wakes its subscribers at commit.
func queuePublish(ctx context.Context, batch *pgx.Batch, topic string, evs []Event) error {
	msgs := make(message.Messages, 0, len(evs))
	for _, e := range evs {
		body, err := json.Marshal(e)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), body)
		msg.Metadata.Set("event_type", e.Type)
		msg.SetContext(ctx)
		msgs = append(msgs, msg)
	}
	q, err := BusSchema.InsertQuery(wmsql.InsertQueryParams{Topic: topic, Msgs: msgs})
	if err != nil {
		return fmt.Errorf("publish on %s: %w", topic, err)
	}
	batch.Queue(q.Query, q.Args...)
	queueNotify(batch, topic)
	return nil
}

const eventColumns = `position, stream_id, stream_type, version, event_type, schema_version,
	payload::text, metadata::text, recorded_at, hash`

func scanEvents(rows pgx.Rows) ([]Event, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var payload, meta string
		err := r.Scan(&e.Position, &e.StreamID, &e.StreamType, &e.Version, &e.Type, &e.SchemaVersion,
			&payload, &meta, &e.RecordedAt, &e.Hash)
		e.Payload, e.Metadata = json.RawMessage(payload), json.RawMessage(meta)
		e.RecordedAt = e.RecordedAt.UTC()
		return e, err
	})
}

// Load reads a stream's events in version order.
func Load(ctx context.Context, q postgres.Querier, streamID string) ([]Event, error) {
	return LoadAfter(ctx, q, streamID, 0)
}

// LoadAfter reads a stream's events after version, in version order: what an aggregate
// kept at version misses.
func LoadAfter(ctx context.Context, q postgres.Querier, streamID string, version int64) ([]Event, error) {
	rows, err := q.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE stream_id = $1 AND version > $2 ORDER BY version`, streamID, version)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

// ReadFrom reads up to limit events after position, in position order. Because positions
// are gapless and follow commit order, a reader that continues from the last position it
// saw never misses an event.
func ReadFrom(ctx context.Context, q postgres.Querier, after int64, limit int) ([]Event, error) {
	rows, err := q.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE position > $1 ORDER BY position LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

// StreamVersion is a stream's current version (0 when it does not exist).
func StreamVersion(ctx context.Context, q postgres.Querier, streamID string) (int64, error) {
	var v int64
	err := q.QueryRow(ctx, `SELECT version FROM streams WHERE stream_id = $1`, streamID).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// Head is the position of the last committed event.
func Head(ctx context.Context, q postgres.Querier) (int64, error) {
	var p int64
	err := q.QueryRow(ctx, `SELECT position FROM event_chain`).Scan(&p)
	return p, err
}

// Querier is a pool or a transaction.
type Querier = postgres.Querier
