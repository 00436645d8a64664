package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"chessd/domain"
	"chessd/eventstore"
)

// A dispute is a customer's question about some of their charges, answered by an
// operator: accepted (each charge is credited, pointing at the dispute) or rejected
// with a reason. Every step is an event on the dispute's own stream; the disputes read
// model is written inline, with the events.

// StreamDispute is the stream type of disputes: "dispute-<id>".
const StreamDispute = "dispute"

// DisputeStream is a dispute's stream.
func DisputeStream(id string) string { return "dispute-" + id }

// Dispute states.
const (
	DisputeOpen     = "open"
	DisputeAccepted = "accepted"
	DisputeRejected = "rejected"
)

// MaxDisputeCharges bounds the charges of one dispute.
const MaxDisputeCharges = 100

type DisputeOpened struct {
	DisputeID string    `json:"dispute_id"`
	AccountID string    `json:"account_id"`
	KeyID     string    `json:"key_id"` // the key that opened it
	Env       string    `json:"env"`
	ChargeIDs []string  `json:"charge_ids"`
	Reason    string    `json:"reason"`
	OpenedAt  time.Time `json:"opened_at"`
}

type DisputeWasAccepted struct {
	By         string    `json:"by"`
	Note       string    `json:"note"`
	CreditIDs  []string  `json:"credit_ids"`
	ResolvedAt time.Time `json:"resolved_at"`
}

type DisputeWasRejected struct {
	By         string    `json:"by"`
	Reason     string    `json:"reason"`
	ResolvedAt time.Time `json:"resolved_at"`
}

func (*DisputeOpened) EventType() string      { return "DisputeOpened" }
func (*DisputeWasAccepted) EventType() string { return "DisputeAccepted" }
func (*DisputeWasRejected) EventType() string { return "DisputeRejected" }

func init() {
	domain.RegisterEvent("DisputeOpened", func() domain.Event { return &DisputeOpened{} })
	domain.RegisterEvent("DisputeAccepted", func() domain.Event { return &DisputeWasAccepted{} })
	domain.RegisterEvent("DisputeRejected", func() domain.Event { return &DisputeWasRejected{} })
	eventstore.RegisterInline(eventstore.TopicOf(StreamDispute), QueueDisputes)
}

// CheckDispute adds the problems of a dispute's charge ids and reason to p, as
// OpenDispute finds them, so that a handler can name them with its own in one refusal.
func CheckDispute(p *domain.Problems, chargeIDs []string, reason string) {
	if len(chargeIDs) == 0 || len(chargeIDs) > MaxDisputeCharges {
		p.Add("charge_ids", fmt.Sprintf("must list 1 to %d charge ids", MaxDisputeCharges))
	}
	seen := map[string]bool{}
	for i, id := range chargeIDs {
		if id == "" {
			// named by its index, not looked up as a charge (404 no charge ""), nor
			// listed twice; also what an element the decoder refused leaves, which
			// the handler names once (httpapi's withProblems)
			p.Add(fmt.Sprintf("charge_ids[%d]", i), "must not be empty: a charge id (chg_…)")
			continue
		}
		if seen[id] {
			p.Add("charge_ids", fmt.Sprintf("lists %q twice", id))
		}
		seen[id] = true
	}
	if strings.TrimSpace(reason) == "" {
		p.Add("reason", "is required: say what is wrong with these charges")
	}
}

// OpenDispute opens a dispute of key's account on chargeIDs (charges of its account
// and env), inside tx. A charge unknown to the key (or another account's) is 404; one
// credited already, or disputed already, 409.
func OpenDispute(ctx context.Context, tx *eventstore.Tx, key *domain.Key, chargeIDs []string, reason, requestID string, now time.Time) (*DisputeOpened, error) {
	var p domain.Problems
	CheckDispute(&p, chargeIDs, reason)
	if err := p.Err(); err != nil {
		return nil, err
	}
	e := &DisputeOpened{DisputeID: "dsp_" + strings.TrimPrefix(newCreditID(), "crd_"), AccountID: key.AccountID(), KeyID: key.ID(),
		Env: key.Env().String(), ChargeIDs: chargeIDs, Reason: reason, OpenedAt: now.UTC().Truncate(time.Microsecond)}
	if err := LockCharges(ctx, tx, chargeIDs); err != nil { // before the credited check: see LockCharges
		return nil, err
	}
	for _, id := range chargeIDs {
		var account, env string
		err := tx.QueryRow(ctx, `SELECT account_id, env FROM charge_lines() WHERE `+chargeByID, chargeIDArgs(id)...).Scan(&account, &env)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && (account != e.AccountID || env != e.Env)) {
			return nil, domain.Errorf(domain.CodeNotFound, "no charge %q on this account (%s)", id, e.Env)
		}
		if err != nil {
			return nil, fmt.Errorf("open dispute: %w", err)
		}
		var credited bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM credited_charges WHERE charge_id = $1)`, id).Scan(&credited); err != nil {
			return nil, fmt.Errorf("open dispute: %w", err)
		}
		if credited {
			return nil, domain.Errorf(domain.CodeConflict, "charge %s is already credited", id)
		}
		var other string
		err = tx.QueryRow(ctx, `INSERT INTO disputed_charges (charge_id, dispute_id) VALUES ($1, $2)
			ON CONFLICT (charge_id) DO UPDATE SET charge_id = excluded.charge_id RETURNING dispute_id`, id, e.DisputeID).Scan(&other)
		if err != nil {
			return nil, fmt.Errorf("open dispute: %w", err)
		}
		if other != e.DisputeID {
			return nil, domain.Errorf(domain.CodeConflict, "charge %s is already disputed (%s)", id, other)
		}
	}
	md := eventstore.Metadata{RequestID: requestID, AccountID: e.AccountID, KeyID: e.KeyID}
	if err := tx.Append(ctx, DisputeStream(e.DisputeID), StreamDispute, 0, md, eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e}); err != nil {
		return nil, err
	}
	return e, nil
}

// ResolveDispute answers an open dispute inside tx, on by's decision: accepted credits
// every charge of it (note is kept, and shown to the customer); rejected needs a
// reason. A dispute already resolved is 409.
func ResolveDispute(ctx context.Context, tx *eventstore.Tx, disputeID string, accept bool, by, note, requestID string, now time.Time) error {
	evs, err := eventstore.Load(ctx, tx, DisputeStream(disputeID))
	if err != nil {
		return err
	}
	if len(evs) == 0 {
		return domain.Errorf(domain.CodeNotFound, "no dispute %q", disputeID)
	}
	if len(evs) > 1 {
		return domain.Errorf(domain.CodeConflict, "dispute %s is already resolved (%s)", disputeID, evs[len(evs)-1].Type)
	}
	d, err := domain.Decode(evs[0].Type, evs[0].SchemaVersion, evs[0].Payload)
	if err != nil {
		return err
	}
	opened, ok := d.(*DisputeOpened)
	if !ok {
		return fmt.Errorf("dispute %s starts with %s", disputeID, evs[0].Type)
	}
	if strings.TrimSpace(note) == "" {
		return domain.Invalid("reason", "is required: it is shown to the customer")
	}
	now = now.UTC().Truncate(time.Microsecond)
	var e domain.Event
	if accept {
		if err := LockCharges(ctx, tx, opened.ChargeIDs); err != nil {
			return err
		}
		a := &DisputeWasAccepted{By: by, Note: note, ResolvedAt: now}
		for _, id := range opened.ChargeIDs {
			c, err := Credit(ctx, tx, CreditRequest{ChargeID: id, AccountID: opened.AccountID, Reason: "dispute " + disputeID + ": " + note,
				Actor: by, DisputeID: disputeID, RequestID: requestID}, now)
			if err != nil {
				return err
			}
			a.CreditIDs = append(a.CreditIDs, c.CreditID)
		}
		e = a
	} else {
		e = &DisputeWasRejected{By: by, Reason: note, ResolvedAt: now}
	}
	md := eventstore.Metadata{RequestID: requestID, AccountID: opened.AccountID, CausationID: disputeID}
	return tx.Append(ctx, DisputeStream(disputeID), StreamDispute, 1, md, eventstore.New{Type: e.EventType(), SchemaVersion: 1, Payload: e})
}

// QueueDisputes queues the disputes read model's rows for evs (events of dispute
// streams, in position order): the opening inserts the row, a resolution updates it.
// Keyed by dispute and version, so applying an event twice changes nothing.
func QueueDisputes(b *pgx.Batch, evs []eventstore.Event) error {
	for i := range evs {
		ev := &evs[i]
		v := ev.Value()
		if v == nil {
			d, err := domain.Decode(ev.Type, ev.SchemaVersion, ev.Payload)
			if err != nil {
				return fmt.Errorf("position %d: %w", ev.Position, err)
			}
			v = d
		}
		id := strings.TrimPrefix(ev.StreamID, "dispute-")
		switch x := v.(type) {
		case *DisputeOpened:
			b.Queue(`INSERT INTO disputes (dispute_id, account_id, key_id, env, state, charge_ids, reason, opened_at, version)
				VALUES ($1, $2, $3, $4, 'open', $5, $6, $7, $8) ON CONFLICT (dispute_id) DO NOTHING`,
				id, x.AccountID, x.KeyID, x.Env, x.ChargeIDs, x.Reason, x.OpenedAt, ev.Version)
		case *DisputeWasAccepted:
			b.Queue(`UPDATE disputes SET state = 'accepted', resolved_at = $2, resolved_by = $3, resolution = $4, credit_ids = $5, version = $6
				WHERE dispute_id = $1 AND version < $6`, id, x.ResolvedAt, x.By, x.Note, x.CreditIDs, ev.Version)
		case *DisputeWasRejected:
			b.Queue(`UPDATE disputes SET state = 'rejected', resolved_at = $2, resolved_by = $3, resolution = $4, version = $5
				WHERE dispute_id = $1 AND version < $5`, id, x.ResolvedAt, x.By, x.Reason, ev.Version)
		default:
			return fmt.Errorf("position %d: unexpected %s on a dispute stream", ev.Position, ev.Type)
		}
	}
	return nil
}

const disputeColumns = `dispute_id, account_id, key_id, env, state, charge_ids, reason, opened_at,
	resolved_at, resolved_by, resolution, credit_ids`

// DisputeRow is a dispute as the read model has it.
type DisputeRow struct {
	ID, AccountID, KeyID, Env, State string
	ChargeIDs                        []string
	Reason                           string
	OpenedAt                         time.Time
	ResolvedAt                       *time.Time
	ResolvedBy, Resolution           *string
	CreditIDs                        []string
}

// DisputeQuery selects an account's disputes: in Env (all envs when ""), the one with
// ID when set, in State when set, after the cursor After when set, at most Limit.
type DisputeQuery struct {
	AccountID, Env, ID, State string
	After                     *domain.PageCursor
	Limit                     int // 0: one
}

// Disputes returns what f selects, newest first; next continues the list when more
// follow.
func Disputes(ctx context.Context, q eventstore.Querier, f DisputeQuery) (rows []DisputeRow, next *domain.PageCursor, err error) {
	limit := max(f.Limit, 1)
	var afterAt *time.Time
	var afterID string
	if f.After != nil {
		afterAt, afterID = &f.After.At, f.After.ID
	}
	res, err := q.Query(ctx, `SELECT `+disputeColumns+` FROM disputes
		WHERE account_id = $1 AND ($2 = '' OR env = $2) AND ($3 = '' OR dispute_id = $3) AND ($4 = '' OR state = $4)
		  AND ($5::timestamptz IS NULL OR (opened_at, dispute_id) < ($5, $6))
		ORDER BY opened_at DESC, dispute_id DESC LIMIT $7`, f.AccountID, f.Env, f.ID, f.State, afterAt, afterID, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("disputes: %w", err)
	}
	if rows, err = pgx.CollectRows(res, scanDispute); err != nil {
		return nil, nil, fmt.Errorf("disputes: %w", err)
	}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		next = &domain.PageCursor{At: last.OpenedAt, ID: last.ID}
	}
	return rows, next, nil
}

// OpenDisputes lists every open dispute, oldest first (operators).
func OpenDisputes(ctx context.Context, q eventstore.Querier) ([]DisputeRow, error) {
	rows, err := q.Query(ctx, `SELECT `+disputeColumns+` FROM disputes WHERE state = 'open' ORDER BY opened_at`)
	if err != nil {
		return nil, fmt.Errorf("disputes: %w", err)
	}
	return pgx.CollectRows(rows, scanDispute)
}

func scanDispute(r pgx.CollectableRow) (DisputeRow, error) {
	var d DisputeRow
	err := r.Scan(&d.ID, &d.AccountID, &d.KeyID, &d.Env, &d.State, &d.ChargeIDs, &d.Reason, &d.OpenedAt,
		&d.ResolvedAt, &d.ResolvedBy, &d.Resolution, &d.CreditIDs)
	return d, err
}
