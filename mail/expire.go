package mail

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

// expireBatch is how many rows one statement of Expire deletes or clears (postgres.InBatches).
var expireBatch = 10000

// Expire deletes the outbox's rows that will never be sent again and ended more than
// age ago: the messages sent more than age ago (found by migration 0048's index), and
// those given up more than age ago, out of MaxAttempts tries (by their due_at: when
// the last try failed or its claim lapsed) or ended by migration 0045 (never due: by
// their created_at). It first clears the sealed bodies of the messages given up that
// still hold one: a last try whose claim lapsed unrecorded (its server died), or one
// given up by a release before this; a sender clears the body as it gives a message up
// itself. It answers how many rows it deleted.
//
// Pending messages are left, however long overdue (a server may send them yet), and
// so are the unsent rows an older chessd queued (no due_at): a sender of this release
// takes them over first (adoptOlder), after which they are rows like the others. Any
// number of servers may expire at once: each batch skips the rows another holds.
func Expire(ctx context.Context, pool *pgxpool.Pool, age time.Duration) (int64, error) {
	var n int64
	for _, e := range expiries(age) {
		changed, err := postgres.InBatches(ctx, pool, expireBatch, e.sql, e.args...)
		if e.deletes {
			n += changed
		}
		if err != nil {
			return n, fmt.Errorf("mail: expire (%s): %w", e.what, err)
		}
	}
	return n, nil
}

// expiry is one of Expire's statements: its $1 is the batch's size, args the rest.
type expiry struct {
	what    string
	sql     string
	args    []any
	deletes bool // its rows count in Expire's answer
}

// expiries are Expire's statements, in order. Each reads its rows' ids once (ARRAY),
// locked and limited to a batch: joined instead, the planner may rescan the subquery,
// and each rescan takes a batch more.
func expiries(age time.Duration) []expiry {
	secs := age.Seconds()
	return []expiry{
		{"clear given-up bodies", `UPDATE mail_outbox SET body = '' WHERE id = ANY (ARRAY(
			SELECT id FROM mail_outbox WHERE sent_at IS NULL AND due_at <= now() AND attempts >= $2 AND body <> ''
			 LIMIT $1 FOR UPDATE SKIP LOCKED))`, []any{MaxAttempts}, false},
		{"sent", `DELETE FROM mail_outbox WHERE id = ANY (ARRAY(
			SELECT id FROM mail_outbox WHERE sent_at < now() - make_interval(secs => $2)
			 LIMIT $1 FOR UPDATE SKIP LOCKED))`, []any{secs}, true},
		{"given up", `DELETE FROM mail_outbox WHERE id = ANY (ARRAY(
			SELECT id FROM mail_outbox WHERE sent_at IS NULL AND due_at < now() - make_interval(secs => $2) AND attempts >= $3
			 LIMIT $1 FOR UPDATE SKIP LOCKED))`, []any{secs, MaxAttempts}, true},
		{"ended by 0045", `DELETE FROM mail_outbox WHERE id = ANY (ARRAY(
			SELECT id FROM mail_outbox WHERE sent_at IS NULL AND due_at = 'infinity' AND created_at < now() - make_interval(secs => $2)
			 LIMIT $1 FOR UPDATE SKIP LOCKED))`, []any{secs}, true},
	}
}
