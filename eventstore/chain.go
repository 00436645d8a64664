package eventstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"chessd/postgres"
)

// ChainHash is SHA-256 over the event's position, its content and the previous event's
// hash. Every variable-length field is length-prefixed so no two contents share an input.
func ChainHash(prev []byte, e *Event) []byte {
	h := sha256.New()
	var num [8]byte
	field := func(b []byte) {
		binary.BigEndian.PutUint64(num[:], uint64(len(b)))
		h.Write(num[:])
		h.Write(b)
	}
	integer := func(v int64) {
		binary.BigEndian.PutUint64(num[:], uint64(v))
		h.Write(num[:])
	}
	field(prev)
	integer(e.Position)
	field([]byte(e.StreamID))
	field([]byte(e.StreamType))
	integer(e.Version)
	field([]byte(e.Type))
	integer(int64(e.SchemaVersion))
	field(e.Payload)
	field(e.Metadata)
	integer(e.RecordedAt.UnixMicro())
	return h.Sum(nil)
}

// Tamper names the first place where the log is not what was appended.
type Tamper struct {
	Position int64  // the first event that is wrong or missing
	Kind     string // "edited", "deleted", "reordered", "inserted" or "rewritten"
	Detail   string
}

func (t *Tamper) Error() string {
	return fmt.Sprintf("event at position %d %s: %s", t.Position, t.Kind, t.Detail)
}

// VerifyReport is the outcome of walking the chain.
type VerifyReport struct {
	Events int64   // events checked
	Head   int64   // the position the chain head records
	Tamper *Tamper // nil when the chain is intact
	// Anchor is the last event walked and its hash: kept outside the database, it lets
	// a later Verify catch a rewrite of everything up to it (see Anchor).
	Anchor Anchor
}

// Anchor is a position of the chain and the hash of the event there, kept outside the
// database (printed by `chessd verify`, logged by `chessd serve`). The database alone
// cannot show a rewrite that recomputes every hash after its edit and moves the head
// along; the hash at an anchor's position changes with any such rewrite from before
// it, and an anchor past the log's end shows a truncation.
type Anchor struct {
	Position int64
	Hash     []byte
}

// String writes the anchor as ParseAnchor reads it: position:hex-hash.
func (a Anchor) String() string {
	return strconv.FormatInt(a.Position, 10) + ":" + hex.EncodeToString(a.Hash)
}

// HeadAnchor is the chain's head as an anchor: the last position and its hash.
func HeadAnchor(ctx context.Context, q postgres.Querier) (Anchor, error) {
	var a Anchor
	if err := q.QueryRow(ctx, `SELECT position, hash FROM event_chain`).Scan(&a.Position, &a.Hash); err != nil {
		return a, fmt.Errorf("chain head: %w", err)
	}
	return a, nil
}

// ParseAnchor reads an anchor as String writes it.
func ParseAnchor(s string) (Anchor, error) {
	pos, h, ok := strings.Cut(strings.TrimSpace(s), ":")
	p, err := strconv.ParseInt(pos, 10, 64)
	if !ok || err != nil || p < 1 {
		return Anchor{}, fmt.Errorf("anchor %q: want position:sha256-hex, the position 1 or more", s)
	}
	hash, err := hex.DecodeString(h)
	if err != nil || len(hash) != sha256.Size {
		return Anchor{}, fmt.Errorf("anchor %q: the hash is not 64 hex digits", s)
	}
	return Anchor{Position: p, Hash: hash}, nil
}

// Verify walks the whole log in position order and checks that positions have no gaps,
// each stream's versions run 1, 2, 3..., every hash matches its content and predecessor,
// the chain head matches the last event, and the event at each anchor's position has
// the anchor's hash. Given a pool (anything that begins
// transactions), it reads the head and the log in one read-only REPEATABLE READ
// transaction: a live service appends all the time, and an event committed after the
// head was read would otherwise read as one past the head, an edit.
func Verify(ctx context.Context, q postgres.Querier, anchors ...Anchor) (rep VerifyReport, err error) {
	if b, ok := q.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err := b.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return rep, fmt.Errorf("verify: %w", err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // read only
		return verify(ctx, tx, anchors)
	}
	return verify(ctx, q, anchors)
}

// verify is Verify on one snapshot.
func verify(ctx context.Context, q postgres.Querier, anchors []Anchor) (VerifyReport, error) {
	var rep VerifyReport
	var headHash []byte
	if err := q.QueryRow(ctx, `SELECT position, hash FROM event_chain`).Scan(&rep.Head, &headHash); err != nil {
		return rep, err
	}
	// Every anchor given is checked, several at one position too: if they differ, the
	// event there cannot match them all.
	anchored := make(map[int64][][]byte, len(anchors))
	beyond := Anchor{} // the furthest anchor, for a log that now ends before it
	for _, a := range anchors {
		anchored[a.Position] = append(anchored[a.Position], a.Hash)
		if a.Position > beyond.Position {
			beyond = a
		}
	}
	streams := map[string]int64{}
	var prev []byte
	var last int64
	for {
		evs, err := ReadFrom(ctx, q, last, 1000)
		if err != nil {
			return rep, err
		}
		if len(evs) == 0 {
			break
		}
		for i := range evs {
			e := &evs[i]
			if t := check(e, last, prev, streams); t != nil {
				rep.Tamper = t
				return rep, nil
			}
			if slices.ContainsFunc(anchored[e.Position], func(h []byte) bool { return !bytes.Equal(h, e.Hash) }) {
				rep.Tamper = &Tamper{Position: e.Position, Kind: "rewritten",
					Detail: "its hash is not the anchor's: the log was rewritten, hashes and head included, at or before this event"}
				return rep, nil
			}
			rep.Events++
			streams[e.StreamID] = e.Version
			prev, last = e.Hash, e.Position
		}
	}
	// Every row was walked: one the walk cannot reach (at position 0 or below, which
	// streams' readers by version still fold in) is an insertion.
	var rows, first int64
	if err := q.QueryRow(ctx, `SELECT count(*), coalesce(min(position), 1) FROM events`).Scan(&rows, &first); err != nil {
		return rep, err
	}
	if rows != rep.Events {
		rep.Tamper = &Tamper{Position: first, Kind: "inserted",
			Detail: fmt.Sprintf("%d events stored, %d on the chain (the first at position %d)", rows, rep.Events, first)}
		return rep, nil
	}
	rep.Anchor = Anchor{Position: last, Hash: prev}
	switch {
	case last < beyond.Position:
		rep.Tamper = &Tamper{Position: last + 1, Kind: "deleted",
			Detail: fmt.Sprintf("an anchor records position %d, the log ends at %d", beyond.Position, last)}
	case last < rep.Head:
		rep.Tamper = &Tamper{Position: last + 1, Kind: "deleted",
			Detail: fmt.Sprintf("the chain head records position %d, the log ends at %d", rep.Head, last)}
	case last > rep.Head || !bytes.Equal(prev, headHash):
		rep.Tamper = &Tamper{Position: last, Kind: "edited",
			Detail: "the last event does not match the chain head"}
	}
	return rep, nil
}

func check(e *Event, last int64, prev []byte, streams map[string]int64) *Tamper {
	if e.Position != last+1 {
		return &Tamper{Position: last + 1, Kind: "deleted",
			Detail: fmt.Sprintf("missing; the next event present is at position %d", e.Position)}
	}
	if want := streams[e.StreamID] + 1; e.Version != want {
		// Positions are contiguous here, so a version out of turn was moved.
		return &Tamper{Position: e.Position, Kind: "reordered",
			Detail: fmt.Sprintf("stream %s version %d found where version %d was due", e.StreamID, e.Version, want)}
	}
	if got := ChainHash(prev, e); !bytes.Equal(got, e.Hash) {
		return &Tamper{Position: e.Position, Kind: "edited",
			Detail: fmt.Sprintf("stream %s version %d (%s): content or place changed: stored hash %s, recomputed %s",
				e.StreamID, e.Version, e.Type, short(e.Hash), short(got))}
	}
	return nil
}

func short(b []byte) string {
	s := hex.EncodeToString(b)
	if len(s) > 16 {
		s = s[:16]
	}
	return s
}
