package commands

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
)

// TopicJobCommands is the command bus topic the executors consume.
const TopicJobCommands = "job_commands"

// SubmitJobCommand is what goes on the command bus for each accepted job. Its handler
// name (the executors' consumer group) is part of the schema: never rename it.
type SubmitJobCommand struct {
	JobID string `json:"job_id"`
}

// LoadJob folds a job's stream.
func LoadJob(ctx context.Context, q eventstore.Querier, jobID string) (*domain.Job, error) {
	evs, err := loadStream(ctx, q, domain.JobStream(jobID))
	if err != nil {
		return nil, err
	}
	return domain.RehydrateJob(evs), nil
}

// SubmitJob accepts a job: it reserves the job's whole price on the key's budget and
// the day's allowance (a ledger refusal when it does not fit: 402), appends JobSubmitted and sends SubmitJob on
// the command bus, all in one transaction. With idem set (claimed by ledger.Meter.Claim),
// the answer render makes is stored for the Idempotency-Key in the same transaction, so
// a job is submitted (and its price held) once per key even when retries race or the
// server dies mid-way.
func (h *Handler) SubmitJob(ctx context.Context, actor Actor, allowance int64, s domain.JobSubmitted, idem *ledger.Stored,
	render func(*domain.Job) (int, []byte, error)) (*domain.Job, error) {
	s.JobID, s.AccountID, s.KeyID, s.Env = NewID("job"), actor.Key.AccountID(), actor.Key.ID(), actor.Key.Env().String()
	s.SubmittedAt = h.now()
	e, err := domain.NewJob(s)
	if err != nil {
		return nil, err
	}
	_, err = h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		day := e.SubmittedAt.UTC().Format(time.DateOnly)
		if err := ledger.HoldJob(ctx, tx, e.JobID, actor.Key, allowance, day, e.HoldUnits); err != nil {
			return err
		}
		md := actor.meta()
		if idem != nil {
			md.IdempotencyKey = idem.Key
		}
		if err := tx.Append(ctx, domain.JobStream(e.JobID), domain.StreamJob, 0, md, event(e)); err != nil {
			return err
		}
		if idem != nil {
			status, body, err := render(domain.RehydrateJob([]domain.Event{e}))
			if err != nil {
				return err
			}
			st := *idem
			st.Status, st.Response = status, body
			kept, err := ledger.StoreAnswer(ctx, tx, st)
			if err != nil {
				return err
			}
			if !kept { // our claim expired and a retry took it over: it submits the job
				return domain.Errorf(domain.CodeInProgress, "a retry with this Idempotency-Key took it over; retry to get its answer")
			}
		}
		return publishCommand(ctx, tx, SubmitJobCommand{JobID: e.JobID}, actor.RequestID)
	})
	if err != nil {
		return nil, err
	}
	return domain.RehydrateJob([]domain.Event{e}), nil
}

// publishCommand puts a command on the Watermill command bus inside tx: it is
// delivered exactly when the transaction commits.
func publishCommand(ctx context.Context, tx *eventstore.Tx, cmd SubmitJobCommand, requestID string) error {
	body, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx.Tx), wmsql.PublisherConfig{SchemaAdapter: eventstore.BusSchema}, nil)
	if err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), body)
	msg.Metadata.Set("name", "SubmitJob")
	msg.Metadata.Set("request_id", requestID)
	msg.SetContext(ctx)
	if err := pub.Publish(TopicJobCommands, msg); err != nil {
		return err
	}
	return eventstore.Notify(ctx, tx.Tx, TopicJobCommands)
}

// CancelJob cancels one of the actor's jobs: positions analysed so far stay charged,
// the rest of the hold is released, and the executor stops at its next check.
func (h *Handler) CancelJob(ctx context.Context, actor Actor, jobID string) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := LoadJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if !j.VisibleTo(actor.Key) {
			return domain.Errorf(domain.CodeNotFound, "no job %q on this account", jobID)
		}
		e, err := j.Cancel(h.now())
		if err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, j.Version(), actor.meta(), event(e)); err != nil {
			return err
		}
		if err := closeJob(ctx, tx, j); err != nil {
			return err
		}
		j.Apply(e)
		out = j
		return nil
	})
	return out, err
}

// closeJob does what every end of a job does: release what is left of its hold and
// drop its lease.
func closeJob(ctx context.Context, tx *eventstore.Tx, j *domain.Job) error {
	if err := ledger.ReleaseHold(ctx, tx, j.ID()); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM job_leases WHERE job_id = $1`, j.ID())
	return err
}

// ErrNotClaimable says another worker has the job, or it is finished.
var ErrNotClaimable = errors.New("job not claimable")

// ClaimJob gives a job to worker: a queued job starts, a running job whose lease ran
// out is resumed. The lease lasts until renewed by RecordPosition or RenewLease.
func (h *Handler) ClaimJob(ctx context.Context, jobID, worker string, lease time.Duration) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := LoadJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		var e domain.Event
		switch j.State() {
		case domain.StateQueued:
			e, err = j.Start(worker, h.now())
		case domain.StateRunning:
			// only when its lease ran out: the row lock serialises two claimers
			tag, lerr := tx.Exec(ctx, `UPDATE job_leases SET worker = $2, lease_until = now() + $3::interval
				WHERE job_id = $1 AND lease_until < now()`, jobID, worker, lease.String())
			if lerr != nil {
				return lerr
			}
			if tag.RowsAffected() == 0 {
				return ErrNotClaimable
			}
			e, err = j.Resume(worker, h.now())
		default:
			return ErrNotClaimable
		}
		if err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, j.Version(),
			eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID(), CausationID: "SubmitJob"}, event(e)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO job_leases (job_id, worker, lease_until) VALUES ($1, $2, now() + $3::interval)
			ON CONFLICT (job_id) DO UPDATE SET worker = excluded.worker, lease_until = excluded.lease_until`, jobID, worker, lease.String()); err != nil {
			return err
		}
		j.Apply(e)
		out = j
		return nil
	})
	return out, err
}

// RenewLease extends worker's lease on a job; ErrNotClaimable when it lost it.
func (h *Handler) RenewLease(ctx context.Context, jobID, worker string, lease time.Duration) error {
	tag, err := h.store.Pool().Exec(ctx, `UPDATE job_leases SET lease_until = now() + $3::interval WHERE job_id = $1 AND worker = $2`,
		jobID, worker, lease.String())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotClaimable
	}
	return nil
}

// Position is one analysed position of a job, as the executor reports it.
type Position struct {
	Index  int
	Result json.RawMessage
	Cached bool
	Units  int64
	USD    decimal.Decimal
	Params ledger.Params
	Engine string
	Path   string
}

// RecordPositions appends analysed positions' results and charges each against the
// job's hold, in one transaction guarded by the job's version: a position is recorded
// and charged once, and never after the job was cancelled. The executor hands over
// whatever finished while its previous record was being written, so a busy job writes
// one transaction per few positions, not one each. It returns the job as it now stands.
func (h *Handler) RecordPositions(ctx context.Context, key *domain.Key, jobID, worker string, ps []Position, lease time.Duration) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := LoadJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if j.State() != domain.StateRunning || j.Worker() != worker {
			return ErrNotClaimable
		}
		expected := j.Version()
		var evs []eventstore.New
		for _, p := range ps {
			if j.Result(p.Index) != nil {
				continue // recorded by an earlier try whose commit's outcome was not known: once only
			}
			charge := ledger.Charge{RequestID: "job:" + jobID, Key: key, Endpoint: domain.Endpoint(j.Kind()),
				Params: p.Params, Engine: p.Engine, Path: p.Path, Cached: p.Cached, Units: p.Units, USD: p.USD}
			uc, err := ledger.ChargeHeld(ctx, tx, jobID, j.SubmittedAt().UTC().Format(time.DateOnly), charge, h.now())
			if err != nil {
				return err
			}
			e, err := j.Analysed(domain.JobPositionAnalysed{Index: p.Index, Result: p.Result, Cached: p.Cached,
				Units: p.Units, USD: p.USD, ChargeID: uc.ChargeID, At: h.now()})
			if err != nil {
				return err
			}
			j.Apply(e)
			ev := event(e)
			ev.Meta = &eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID(), CausationID: uc.ChargeID}
			evs = append(evs, ev)
		}
		if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, expected, eventstore.Metadata{}, evs...); err != nil {
			return err
		}
		if len(evs) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE job_leases SET lease_until = now() + $3::interval WHERE job_id = $1 AND worker = $2`,
				jobID, worker, lease.String()); err != nil {
				return err
			}
		}
		out = j
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FinishJob ends a running job: succeeded when every position is analysed, else failed
// with problem. What is left of the hold is released.
func (h *Handler) FinishJob(ctx context.Context, jobID, worker string, problem *domain.Error) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := LoadJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if j.State() != domain.StateRunning || j.Worker() != worker {
			return ErrNotClaimable
		}
		var e domain.Event
		if problem == nil {
			e, err = j.Succeed(h.now())
		} else {
			e, err = j.Fail(problem.Code, problem.Message, h.now())
		}
		if err != nil {
			return err
		}
		if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, j.Version(),
			eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID()}, event(e)); err != nil {
			return err
		}
		if err := closeJob(ctx, tx, j); err != nil {
			return err
		}
		j.Apply(e)
		out = j
		return nil
	})
	return out, err
}
