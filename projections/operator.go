package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/domain"
	"chessd/eventstore"
)

// SetAsideEvent is one row of set_aside_events, with the last action taken on it.
type SetAsideEvent struct {
	ID         int64
	Projection string
	Position   int64
	StreamID   string
	EventType  string
	Error      string
	HeldBy     *int64 // the earlier set-aside event it waits behind; nil: it failed itself
	Attempts   int
	FirstSeen  time.Time
	LastSeen   time.Time
	State      string // open | retried | skipped
	LastAction *SetAsideAction
}

// SetAsideAction is one recorded action on a set-aside event.
type SetAsideAction struct {
	Action  string // retry | skip | rebuild
	Outcome string // applied | skipped | failed: <error>
	Actor   string
	Reason  string
	At      time.Time
}

// ListSetAside lists the open set-aside events in log order, or every one when all.
func ListSetAside(ctx context.Context, q eventstore.Querier, all bool) ([]SetAsideEvent, error) {
	rows, err := q.Query(ctx, `SELECT s.id, s.projection, s.position, s.stream_id, s.event_type, s.error, s.held_by,
			s.attempts, s.first_seen, s.last_seen, s.state, a.action, a.outcome, a.actor, a.reason, a.at
		FROM set_aside_events s
		LEFT JOIN LATERAL (SELECT * FROM set_aside_actions WHERE set_aside_id = s.id ORDER BY id DESC LIMIT 1) a ON true
		WHERE $1 OR s.state = 'open' ORDER BY s.position, s.projection`, all)
	if err != nil {
		return nil, fmt.Errorf("list set-aside events: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SetAsideEvent, error) {
		var s SetAsideEvent
		var action, outcome, actor, reason *string
		var at *time.Time
		err := r.Scan(&s.ID, &s.Projection, &s.Position, &s.StreamID, &s.EventType, &s.Error, &s.HeldBy,
			&s.Attempts, &s.FirstSeen, &s.LastSeen, &s.State, &action, &outcome, &actor, &reason, &at)
		if action != nil {
			s.LastAction = &SetAsideAction{Action: *action, Outcome: *outcome, Actor: *actor, Reason: *reason, At: *at}
		}
		return s, err
	})
}

// Resolution is what an operator's retry or skip did.
type Resolution struct {
	Projection string
	Position   int64   // the set-aside event acted on
	Applied    []int64 // positions applied: the event itself (retry), then those held behind it
	FailedAt   int64   // the position that still cannot be applied, 0 when none
	Cause      string  // its error
	StillHeld  int     // events still held behind FailedAt
}

// RetrySetAside applies set-aside event id again (after a fix of the projection, say).
// When it applies, it is marked retried and the events held behind it are applied in
// order, until one fails, which then stays open with its new error. Every outcome is
// recorded in set_aside_actions under actor; the events table is never touched.
func RetrySetAside(ctx context.Context, pool *pgxpool.Pool, ps []Projection, id int64, actor, reason string) (Resolution, error) {
	return resolve(ctx, pool, ps, id, "retry", actor, reason)
}

// SkipSetAside marks set-aside event id skipped: its projection leaves it out for good,
// rebuilds included. The events held behind it are then applied as RetrySetAside does.
func SkipSetAside(ctx context.Context, pool *pgxpool.Pool, ps []Projection, id int64, actor, reason string) (Resolution, error) {
	if reason == "" {
		return Resolution{}, domain.Invalid("reason", "say why the event is skipped")
	}
	return resolve(ctx, pool, ps, id, "skip", actor, reason)
}

func resolve(ctx context.Context, pool *pgxpool.Pool, ps []Projection, id int64, action, actor, reason string) (Resolution, error) {
	if actor == "" {
		return Resolution{}, domain.Invalid("actor", "name who acts")
	}
	var res Resolution
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res = Resolution{}
		var stream, state string
		err := tx.QueryRow(ctx, `SELECT projection, stream_id, position, state FROM set_aside_events WHERE id = $1 FOR UPDATE`, id).
			Scan(&res.Projection, &stream, &res.Position, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return domain.Errorf(domain.CodeNotFound, "no set-aside event %d", id)
		}
		if err != nil {
			return fmt.Errorf("read set-aside event %d: %w", id, err)
		}
		if state != "open" {
			return domain.Errorf(domain.CodeConflict, "set-aside event %d is already %s", id, state)
		}
		var p Projection
		for _, c := range ps {
			if c.Name() == res.Projection {
				p = c
			}
		}
		if p == nil {
			return fmt.Errorf("set-aside event %d belongs to projection %s, which this binary does not have", id, res.Projection)
		}
		ctx := withProjection(ctx, p.Name())
		if action == "skip" {
			if err := settle(ctx, tx, id, "skipped", "skip", "skipped", actor, reason); err != nil {
				return err
			}
		} else {
			// An event held behind an earlier one of its stream, still open, waits for it:
			// retrying it would apply that one too (events apply in stream order) while
			// leaving it listed open, so a later skip of it would make a rebuild differ.
			var blocker int64
			err := tx.QueryRow(ctx, `SELECT id FROM set_aside_events WHERE projection = $1 AND stream_id = $2 AND state = 'open'
				AND position < $3 ORDER BY position LIMIT 1`, p.Name(), stream, res.Position).Scan(&blocker)
			if err == nil {
				return domain.Errorf(domain.CodeConflict, "set-aside event %d waits behind set-aside event %d of its stream, still open: retry or skip that one first", id, blocker)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read set-aside events before %d: %w", id, err)
			}
			cause, err := tryApply(ctx, tx, p, res.Position)
			if err != nil {
				return err
			}
			if cause != nil {
				res.FailedAt, res.Cause = res.Position, cause.Error()
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM set_aside_events
					WHERE projection = $1 AND stream_id = $2 AND state = 'open' AND position > $3`,
					p.Name(), stream, res.Position).Scan(&res.StillHeld); err != nil {
					return fmt.Errorf("count held events: %w", err)
				}
				return failed(ctx, tx, id, cause, "retry", actor, reason)
			}
			if err := settle(ctx, tx, id, "retried", "retry", "applied", actor, reason); err != nil {
				return err
			}
			res.Applied = append(res.Applied, res.Position)
		}
		return release(ctx, tx, p, stream, id, &res, actor)
	})
	return res, err
}

// release applies, in order, the open events of stream after the one just resolved.
func release(ctx context.Context, tx pgx.Tx, p Projection, stream string, resolved int64, res *Resolution, actor string) error {
	type follower struct{ id, position int64 }
	rows, err := tx.Query(ctx, `SELECT id, position FROM set_aside_events
		WHERE projection = $1 AND stream_id = $2 AND state = 'open' AND position > $3 ORDER BY position FOR UPDATE`,
		p.Name(), stream, res.Position)
	if err != nil {
		return fmt.Errorf("read held events: %w", err)
	}
	followers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (follower, error) {
		var f follower
		return f, r.Scan(&f.id, &f.position)
	})
	if err != nil {
		return fmt.Errorf("read held events: %w", err)
	}
	why := fmt.Sprintf("held behind set-aside event %d", resolved)
	for i, f := range followers {
		cause, err := tryApply(ctx, tx, p, f.position)
		if err != nil {
			return err
		}
		if cause != nil {
			res.FailedAt, res.Cause, res.StillHeld = f.position, cause.Error(), len(followers)-i-1
			if err := failed(ctx, tx, f.id, cause, "retry", actor, why); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE set_aside_events SET held_by = $3
				WHERE projection = $1 AND stream_id = $2 AND state = 'open' AND position > $3`, p.Name(), stream, f.position)
			return err
		}
		if err := settle(ctx, tx, f.id, "retried", "retry", "applied", actor, why); err != nil {
			return err
		}
		res.Applied = append(res.Applied, f.position)
	}
	return nil
}

// tryApply applies the event at position under a savepoint. cause is why the
// projection cannot apply it (it stays set aside); err is anything else.
func tryApply(ctx context.Context, tx pgx.Tx, p Projection, position int64) (cause, err error) {
	evs, err := eventstore.ReadFrom(ctx, tx, position-1, 1)
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 || evs[0].Position != position {
		return nil, fmt.Errorf("no event at position %d", position)
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT one`); err != nil {
		return nil, err
	}
	applyErr := p.Apply(ctx, tx, evs[0])
	if applyErr == nil {
		_, err := tx.Exec(ctx, `RELEASE SAVEPOINT one`)
		return nil, err
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT one; RELEASE SAVEPOINT one`); err != nil {
		return nil, fmt.Errorf("position %d: %w (rolling back: %w)", position, applyErr, err)
	}
	if !CannotApply(applyErr) {
		return nil, fmt.Errorf("position %d: %w", position, applyErr)
	}
	return applyErr, nil
}

// settle moves a set-aside event to state and records the action.
func settle(ctx context.Context, tx pgx.Tx, id int64, state, action, outcome, actor, reason string) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE set_aside_events SET state = $2 WHERE id = $1`, id, state)
	queueAction(b, id, action, outcome, actor, reason)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record %s of set-aside event %d: %w", action, id, err)
	}
	return nil
}

// failed records a failed attempt: the new error (the event now fails itself rather
// than waiting behind another), and the action.
func failed(ctx context.Context, tx pgx.Tx, id int64, cause error, action, actor, reason string) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE set_aside_events SET error = $2, held_by = NULL, attempts = attempts + 1, last_seen = now() WHERE id = $1`,
		id, storable(cause.Error()))
	queueAction(b, id, action, "failed: "+cause.Error(), actor, reason)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record %s of set-aside event %d: %w", action, id, err)
	}
	return nil
}

func queueAction(b *pgx.Batch, id int64, action, outcome, actor, reason string) {
	b.Queue(`INSERT INTO set_aside_actions (set_aside_id, action, outcome, actor, reason) VALUES ($1, $2, $3, $4, $5)`,
		id, action, storable(outcome), storable(actor), storable(reason))
}
