package commands

import (
	"context"
	"encoding/json"
	"fmt"
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
		if err := enqueue(ctx, tx, e); err != nil {
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
	j := domain.RehydrateJob([]domain.Event{e})
	h.jobs.keep(j.Clone()) // the worker that starts it is often this process: its start reads no stream
	return j, nil
}

// Job returns a job for its positions and spec, which never change once submitted:
// this process's copy when it has one (it submitted or worked on the job), else the
// job's stream folded. Its state may be behind the log's.
func (h *Handler) Job(ctx context.Context, jobID string) (*domain.Job, error) {
	if j := h.jobs.peek(jobID); j != nil {
		return j, nil
	}
	return LoadJob(ctx, h.store.Pool(), jobID)
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
// the rest of the hold is released and its positions leave the queue: every worker
// searching one of them hears of it (TopicJobsClosed) and stops.
func (h *Handler) CancelJob(ctx context.Context, actor Actor, jobID string) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := h.loadLockedJob(ctx, tx, jobID)
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

// TopicJobsClosed is announced (NOTIFY, at commit) when a job's positions leave the
// queue at its end: a worker searching one of them checks its leases at once and stops
// it, instead of at its next renewal.
const TopicJobsClosed = "jobs_closed"

// closeJob does what every end of a job does: release what is left of its hold, take
// its positions off the queue and tell the workers (TopicJobsClosed), so that one
// searching a position of it sees its lease gone and stops.
func closeJob(ctx context.Context, tx *eventstore.Tx, j *domain.Job) error {
	if err := ledger.ReleaseHold(ctx, tx, j.ID()); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM job_queue WHERE job_id = $1`, j.ID()); err != nil {
		return err
	}
	return eventstore.Notify(ctx, tx, TopicJobsClosed)
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
// job's hold, in one transaction: a position is recorded and charged only while worker
// still holds it on the queue (its row is deleted here), so once however many workers
// analysed it, and never after the job ended. The transaction that records a job's
// last position also ends it (JobSucceeded) and releases what is left of its hold.
// Recorders of one job take turns (a transaction-scoped lock on the job), so workers
// recording the same job at once wait for each other rather than conflict. It returns
// the job as it now stands; ErrNotClaimable when the job is no longer running.
func (h *Handler) RecordPositions(ctx context.Context, key *domain.Key, jobID, worker string, ps []Position) (*domain.Job, error) {
	var out *domain.Job
	var stopped bool
	committed, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		stopped = false
		j, err := h.loadLockedJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if j.State() != domain.StateRunning {
			return ErrNotClaimable
		}
		// A key revoked, or whose budget was lowered below what it holds, since the job
		// started ends the job here, before anything more is charged: the positions
		// recorded stay charged, the rest of the hold goes back.
		if problem, err := keyStops(ctx, tx, key); err != nil {
			return err
		} else if problem != nil {
			if err := h.failLocked(ctx, tx, j, worker, problem); err != nil {
				return err
			}
			out, stopped = j, true
			return nil
		}
		expected := j.Version()
		indexes := make([]int32, len(ps))
		for i, p := range ps {
			indexes[i] = int32(p.Index)
		}
		held, err := release(ctx, tx, jobID, indexes, worker)
		if err != nil {
			return err
		}
		var record []Position
		var charges []ledger.Charge
		for _, p := range ps {
			if !held[p.Index] || j.Result(p.Index) != nil {
				continue // taken over by another worker, or recorded before: once only
			}
			delete(held, p.Index) // and once within ps
			record = append(record, p)
			charges = append(charges, ledger.Charge{RequestID: "job:" + jobID, Key: key, Endpoint: domain.Endpoint(j.Kind()),
				Params: p.Params, Engine: p.Engine, Path: p.Path, Cached: p.Cached, Units: p.Units, USD: p.USD})
		}
		ucs, err := ledger.ChargeHeld(ctx, tx, jobID, j.SubmittedAt().UTC().Format(time.DateOnly), charges, h.now())
		if err != nil {
			return err
		}
		var evs []eventstore.New
		for i, p := range record {
			e, err := j.Analysed(domain.JobPositionAnalysed{Index: p.Index, Result: p.Result, Cached: p.Cached,
				Units: p.Units, USD: p.USD, ChargeID: ucs[i].ChargeID, Worker: worker, At: h.now()})
			if err != nil {
				return err
			}
			j.Apply(e)
			ev := event(e)
			ev.Meta = &eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID(), CausationID: ucs[i].ChargeID}
			evs = append(evs, ev)
		}
		if j.Done() == len(j.Positions()) {
			e, err := j.Succeed(h.now())
			if err != nil {
				return err
			}
			j.Apply(e)
			ev := event(e)
			ev.Meta = &eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID()}
			evs = append(evs, ev)
			if err := closeJob(ctx, tx, j); err != nil {
				return err
			}
		}
		if err := tx.Append(ctx, domain.JobStream(jobID), domain.StreamJob, expected, eventstore.Metadata{}, evs...); err != nil {
			return err
		}
		out = j
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.jobs.keep(out.Clone()) // the caller has out
	if stopped {
		return nil, ErrNotClaimable
	}
	ledger.CountCommitted(committed) // the positions' charges, for /metrics
	return out, nil
}

// keyStops says why a job of key may charge nothing more: the key was revoked, or its
// budget or its account's was lowered below what has been spent this period and is
// held, since key was loaded (by StartJob, which checked it then). The key's and the
// account's stream rows are read FOR SHARE: a change of either (it appends to its
// stream, then writes its budget) that is committing is waited for and seen here, and
// one that starts later waits for this record's commit, so no charge slips in between
// a change and its check (one did, with the change waiting on the key's balance row).
// A key unchanged since costs this lookup and the account's check.
func keyStops(ctx context.Context, tx *eventstore.Tx, key *domain.Key) (*domain.Error, error) {
	keyStream := domain.KeyStream(key.ID())
	rows, err := tx.Query(ctx, `SELECT stream_id, version FROM streams WHERE stream_id = ANY($1) ORDER BY stream_id FOR SHARE`,
		[]string{keyStream, domain.AccountStream(key.AccountID())})
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", key.ID(), err)
	}
	version := int64(-1)
	for rows.Next() {
		var id string
		var v int64
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("key %s: %w", key.ID(), err)
		}
		if id == keyStream {
			version = v
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("key %s: %w", key.ID(), err)
	}
	if version == key.Version() {
		return accountRefuses(ctx, tx, key)
	}
	now, err := LoadKey(ctx, tx, key.ID())
	if err != nil {
		return nil, err
	}
	return keyRefuses(ctx, tx, now)
}

// keyRefuses says why a job of key, as it now stands, may charge nothing more.
func keyRefuses(ctx context.Context, tx *eventstore.Tx, key *domain.Key) (*domain.Error, error) {
	if key.Status() != domain.StatusActive {
		return domain.Errorf(domain.CodeBadCredential, "the job's key was revoked: its other positions were not analysed, and are not charged"), nil
	}
	over, err := ledger.KeyOverHeld(ctx, tx, key.ID())
	if err != nil {
		return nil, err
	}
	if over {
		return domain.Errorf(domain.CodeBudget, "the job's key's budget was lowered below what its jobs hold: its other positions were not analysed, and are not charged"), nil
	}
	return accountRefuses(ctx, tx, key)
}

// accountRefuses says why a job of key may charge nothing more on its account: the
// account's budget in the key's env was lowered below what its keys have spent this
// period and hold (no account's budget is ever crossed: decisions.md).
func accountRefuses(ctx context.Context, tx *eventstore.Tx, key *domain.Key) (*domain.Error, error) {
	over, err := ledger.AccountOverHeld(ctx, tx, key.AccountID(), key.Env().String())
	if err != nil {
		return nil, err
	}
	if over {
		return domain.Errorf(domain.CodeBudget, "the account's budget was lowered below what its keys have spent and hold: the job's other positions were not analysed, and are not charged"), nil
	}
	return nil, nil
}

// FailJob ends a running job with problem (a position that cannot be analysed): what
// is left of the hold is released and the other workers on it stop. Any worker of the
// job may fail it; ErrNotClaimable when it already ended.
func (h *Handler) FailJob(ctx context.Context, jobID, worker string, problem *domain.Error) (*domain.Job, error) {
	var out *domain.Job
	_, err := h.store.Transact(ctx, func(ctx context.Context, tx *eventstore.Tx) error {
		j, err := h.loadLockedJob(ctx, tx, jobID)
		if err != nil {
			return err
		}
		if j.State() != domain.StateRunning {
			return ErrNotClaimable
		}
		if err := h.failLocked(ctx, tx, j, worker, problem); err != nil {
			return err
		}
		out = j
		return nil
	})
	return out, err
}

// failLocked ends running job j, locked in tx, with problem on worker's behalf: its
// JobFailed, the rest of its hold released, its positions off the queue (closeJob).
func (h *Handler) failLocked(ctx context.Context, tx *eventstore.Tx, j *domain.Job, worker string, problem *domain.Error) error {
	e, err := j.Fail(problem.Code, problem.Message, h.now())
	if err != nil {
		return err
	}
	if err := tx.Append(ctx, domain.JobStream(j.ID()), domain.StreamJob, j.Version(),
		eventstore.Metadata{AccountID: j.AccountID(), KeyID: j.KeyID(), CausationID: worker}, event(e)); err != nil {
		return err
	}
	if err := closeJob(ctx, tx, j); err != nil {
		return err
	}
	j.Apply(e)
	return nil
}
