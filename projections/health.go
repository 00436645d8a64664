package projections

import (
	"context"
	"fmt"
	"slices"

	"chessd/eventstore"
)

// All is every projection the service runs.
func All() []Projection { return []Projection{Accounts{}, Ledger{}, Jobs{}, Disputes{}} }

// Status is how far a projection has got and what it set aside.
type Status struct {
	Name     string `json:"-"`
	Position int64  `json:"position"`  // the highest position it has processed
	Lag      int64  `json:"lag"`       // events of its topic after that, counted up to MaxLag
	SetAside int64  `json:"set_aside"` // open set-aside events (chessd setaside list)
	// Inline: written by the appends themselves (Inline), so at the head with no lag by
	// construction; its set-aside events come from rebuilds and earlier versions.
	Inline bool `json:"inline,omitempty"`
}

// MaxLag bounds the count of events behind, so a far-behind projection does not make
// the health check slow.
const MaxLag = 100_000

// Statuses reads the head of the log and each projection's status.
func Statuses(ctx context.Context, q eventstore.Querier, ps []Projection) (int64, []Status, error) {
	head, err := eventstore.Head(ctx, q)
	if err != nil {
		return 0, nil, fmt.Errorf("read head: %w", err)
	}
	var known []string
	for t := range eventstore.Topics {
		known = append(known, t)
	}
	out := make([]Status, 0, len(ps))
	for _, p := range ps {
		st := Status{Name: p.Name()}
		if Inline(p) {
			st.Position, st.Inline = head, true
			err := q.QueryRow(ctx, `SELECT count(*) FROM set_aside_events WHERE projection = $1 AND state = 'open'`, p.Name()).Scan(&st.SetAside)
			if err != nil {
				return 0, nil, fmt.Errorf("status of %s: %w", p.Name(), err)
			}
			out = append(out, st)
			continue
		}
		var types []string
		for t, topic := range eventstore.Topics {
			if topic == p.Topic() {
				types = append(types, t)
			}
		}
		slices.Sort(types)
		err := q.QueryRow(ctx, `SELECT
				coalesce((SELECT position FROM projection_checkpoints WHERE name = $1), 0),
				(SELECT count(*) FROM set_aside_events WHERE projection = $1 AND state = 'open')`, p.Name()).
			Scan(&st.Position, &st.SetAside)
		if err != nil {
			return 0, nil, fmt.Errorf("status of %s: %w", p.Name(), err)
		}
		// Stream types Topics does not name go to TopicDefault.
		err = q.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM events WHERE position > $1
				AND (stream_type = ANY($2) OR ($3 AND stream_type <> ALL($4))) LIMIT $5) behind`,
			st.Position, types, p.Topic() == eventstore.TopicDefault, known, MaxLag).Scan(&st.Lag)
		if err != nil {
			return 0, nil, fmt.Errorf("lag of %s: %w", p.Name(), err)
		}
		out = append(out, st)
	}
	return head, out, nil
}
