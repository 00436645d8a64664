package projections

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/eventstore"
	"chessd/postgres"
)

// Inline reports whether p is written by the transactions that append its events
// (eventstore.RegisterInline): it has no subscriber and no checkpoint, and it is never
// behind the log. Its events must not depend on each other, since its writer cannot
// hold an event behind a set-aside one; a rebuild does not hold them either.
func Inline(p Projection) bool { return eventstore.Inlined(p.Topic()) }

// catchUpInline applies, once, what p's subscriber left unread on the bus before p
// became inline (a database of an earlier version), retrying while the database is
// away; then the bus holds nothing more for p.
func (r *Runner) catchUpInline(ctx context.Context, p Projection) error {
	for {
		n, err := catchUp(ctx, r.pool, p, r.logger)
		if err == nil {
			if n > 0 {
				r.logger.Info("applied the events an earlier version left on the bus", "projection", p.Name(), "events", n)
			}
			return nil
		}
		if ctx.Err() != nil || !postgres.IsTransient(err) {
			return fmt.Errorf("catch up %s: %w", p.Name(), err)
		}
		r.logger.Warn("catching up an inline projection; retrying", "projection", p.Name(), "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// catchUp applies the events whose bus messages p's consumer group had not
// acknowledged when p became inline (the events appended since carry their rows), sets
// aside those it cannot apply as the subscriber did, and empties p's bus tables and
// checkpoint, all in one transaction. It returns how many events it took; with nothing
// left on the bus (every start after the first) it costs a few statements.
func catchUp(ctx context.Context, pool *pgxpool.Pool, p Projection, logger *slog.Logger) (int, error) {
	messages, offsets := "watermill_"+p.Topic(), "watermill_offsets_"+p.Topic()
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
			messages, offsets).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return nil
		}
		msgs, offs := pgx.Identifier{messages}.Sanitize(), pgx.Identifier{offsets}.Sanitize()
		// One server catches up at a time, after any publisher of the earlier version
		// that is still running has committed.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+msgs+` IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		// Unacknowledged: after the group's offset, as Watermill's subscriber reads.
		rows, err := tx.Query(ctx, `SELECT m.payload FROM `+msgs+` m
			LEFT JOIN `+offs+` o ON o.consumer_group = $1
			WHERE o.consumer_group IS NULL OR m.transaction_id > o.last_processed_transaction_id
				OR (m.transaction_id = o.last_processed_transaction_id AND m."offset" > o.offset_acked)`, p.Name())
		if err != nil {
			return fmt.Errorf("read the bus: %w", err)
		}
		evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventstore.Event, error) {
			var body []byte
			var e eventstore.Event
			if err := r.Scan(&body); err != nil {
				return e, err
			}
			// the envelope is our own json.Marshal of the event (eventstore.queuePublish)
			return e, json.Unmarshal(body, &e)
		})
		if err != nil {
			return fmt.Errorf("read the bus: %w", err)
		}
		slices.SortFunc(evs, func(a, b eventstore.Event) int { return cmp.Compare(a.Position, b.Position) })
		a := &applier{p: p, logger: logger}
		for _, e := range evs {
			if err := a.apply(ctx, tx, e); err != nil {
				return err
			}
		}
		if err := a.release(ctx, tx); err != nil {
			return err
		}
		n = len(evs)
		b := &pgx.Batch{}
		b.Queue(`DELETE FROM ` + msgs)
		b.Queue(`DELETE FROM `+offs+` WHERE consumer_group = $1`, p.Name())
		b.Queue(`DELETE FROM projection_checkpoints WHERE name = $1`, p.Name())
		return tx.SendBatch(ctx, b).Close()
	})
	return n, err
}
