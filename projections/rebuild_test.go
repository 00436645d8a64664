package projections_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/postgres/pgtest"
	"chessd/projections"
)

// roundTrips counts the statements and batches a pool sends: each is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// tracedPool is another pool on pool's database whose round trips are counted.
func tracedPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	trips := &roundTrips{}
	return withTracer(t, pool, trips), trips
}

// withTracer is another pool on pool's database whose queries tracer sees.
func withTracer(t *testing.T, pool *pgxpool.Pool, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = tracer
	traced, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	return traced
}

// bogus is an event no projection knows: it cannot be decoded.
type bogus struct{}

func (*bogus) EventType() string { return "Bogus" }

// setAsideRows are the set-aside events as the projections leave them (not how often
// each was seen).
func setAsideRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return column(t, pool, `SELECT concat_ws(' ', projection, position, stream_id, event_type, held_by, state, error)
		FROM set_aside_events ORDER BY projection, position`)
}

// column is the one text column query gives.
func column(t *testing.T, pool *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A rebuild of a log of many streams, some of whose events the projections cannot apply,
// gives exactly the read models and set-aside events the live projections made, in a
// few round trips per chunk of events rather than some per event: with the set-aside
// events known beforehand (a savepoint around each chunk from the start), and without
// (the first attempt, with no savepoints, is refused and the rebuild starts again).
func TestRebuildEqualsLiveInFewRoundTrips(t *testing.T) {
	defer projections.SetRebuildChunk(32)() // streams span chunks; a refused event is found in its chunk
	pool := pgtest.NewDB(t)
	ctx := context.Background()
	h := commands.New(eventstore.NewStore(pool, quiet), []byte("pepper-for-the-rebuild-test"))
	now := time.Now().UTC().Truncate(time.Microsecond)

	var keys []string
	for i := range 30 {
		su, err := h.Signup(ctx, domain.Signup{Email: fmt.Sprintf("r%d@example.com", i), Name: fmt.Sprintf("R %d", i)}, "req")
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, su.KeyID)
		if i%3 == 0 {
			if err := h.ChangePlan(ctx, su.AccountID, domain.PlanPro, "test"); err != nil {
				t.Fatal(err)
			}
		}
		admin, err := commands.LoadKey(ctx, pool, su.KeyID)
		if err != nil {
			t.Fatal(err)
		}
		actor := commands.Actor{Key: admin, RequestID: "req"}
		k, _, err := h.CreateKey(ctx, actor, domain.KeySettings{Label: "second", Scopes: []domain.Scope{domain.ScopeEval}, Env: domain.EnvLive})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.ID())
		label := "renamed"
		if _, err := h.UpdateKey(ctx, actor, k.ID(), domain.KeyChange{Label: &label}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, _, err := h.RotateKey(ctx, actor, k.ID(), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 0 {
			if _, err := h.RevokeKey(ctx, actor, k.ID()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Accounts the projection cannot apply: a NUL in a name (then a plan change held
	// behind it), a budget over what the read model holds.
	appendRaw(t, pool, domain.AccountStream("acct_nul"), domain.StreamAccount, 0,
		&domain.AccountCreated{AccountID: "acct_nul", Email: "nul@example.com", Name: "Nul\x00Name", Plan: "free", CreatedAt: now})
	if err := h.ChangePlan(ctx, "acct_nul", domain.PlanPro, "held"); err != nil {
		t.Fatal(err)
	}
	huge := decimal.RequireFromString("1e30")
	appendRaw(t, pool, domain.KeyStream("key_huge"), domain.StreamKey, 0,
		&domain.KeyCreated{KeyID: "key_huge", AccountID: "acct_nul", Label: "huge", Scopes: domain.AllScopes,
			Env: "live", BudgetUSD: &huge, Prefix: "ce_live_huge", SecretHash: strings.Repeat("cd", 32), CreatedAt: now})
	// Charges, most of the log.
	for i := range 300 {
		appendCharge(t, pool, charge(keys[i%len(keys)], fmt.Sprintf("req%d", i), true))
	}
	// Jobs: most succeed; one's submission the job stream refuses (a NUL in its engine,
	// which jsonb does not hold), one has an event no one can decode; the events after
	// those are held.
	fens := []string{"8/8/8/8/8/8/8/K6k w - - 0 1", "8/8/8/8/8/8/8/K5k1 w - - 0 1", "8/8/8/8/8/8/8/K4k2 w - - 0 1", "8/8/8/8/8/8/8/K3k3 w - - 0 1"}
	var positions []domain.JobPosition
	for i, fen := range fens {
		positions = append(positions, domain.JobPosition{Index: i, FEN: fen})
	}
	for i := range 20 {
		id := fmt.Sprintf("job_%02d", i)
		engine := "sf-17.1"
		if i == 4 {
			engine = "sf\x00"
		}
		stream := domain.JobStream(id)
		appendRaw(t, pool, stream, domain.StreamJob, 0, &domain.JobSubmitted{JobID: id, AccountID: "acct_j", KeyID: keys[i],
			Env: "live", Kind: "batch", Spec: domain.JobSpec{Depth: 10, MultiPV: 1, Engine: engine, Path: "native"},
			Positions: positions, HoldUnits: 40, HoldUSD: decimal.RequireFromString("0.004"), SubmittedAt: now})
		appendRaw(t, pool, stream, domain.StreamJob, 1, &domain.JobStarted{Worker: "w", StartedAt: now})
		version := int64(2)
		if i == 7 {
			appendRaw(t, pool, stream, domain.StreamJob, version, &bogus{})
			version++
		}
		for p := range fens {
			appendRaw(t, pool, stream, domain.StreamJob, version, &domain.JobPositionAnalysed{Index: p, Result: json.RawMessage(`{"eval":0.5}`),
				Units: 10, USD: decimal.RequireFromString("0.001"), ChargeID: fmt.Sprintf("chg_%s_%d", id, p), Worker: "w", At: now})
			version++
			appendCharge(t, pool, charge(keys[i], fmt.Sprintf("%s-%d", id, p), true))
		}
		switch i {
		case 9: // one still running
		case 10: // one failed
			appendRaw(t, pool, stream, domain.StreamJob, version, &domain.JobFailed{Code: domain.CodeInvalid, Message: "position 2 cannot be analysed", FinishedAt: now})
		default:
			appendRaw(t, pool, stream, domain.StreamJob, version, &domain.JobSucceeded{FinishedAt: now})
		}
	}

	ps := projections.All()
	runProjections(t, pool, ps...)
	pgtest.WaitFor(t, "the projections to apply every event of their topics", func() bool {
		_, sts, err := projections.Statuses(ctx, pool, ps)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			if st.Lag > 0 {
				return false
			}
		}
		return true
	})
	var tables []string
	for _, p := range ps {
		tables = append(tables, p.Tables()...)
	}
	live, liveAside := snapshot(t, pool, tables), setAsideRows(t, pool)
	if len(live["job_stream"]) == 0 || len(live["charges"]) != 380 || len(live["api_keys"]) != 60 {
		t.Fatalf("live read models: %d job stream events, %d charges, %d keys", len(live["job_stream"]), len(live["charges"]), len(live["api_keys"]))
	}
	failed, _, err := projections.ListJobs(ctx, pool, "acct_j", "live", "failed", nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].ID != "job_10" || failed[0].Error == nil || failed[0].Error.Code != domain.CodeInvalid ||
		failed[0].Error.Message != "position 2 cannot be analysed" {
		t.Fatalf("failed jobs listed: %+v, want job_10 with its problem", failed)
	}
	if done, _, err := projections.ListJobs(ctx, pool, "acct_j", "live", "succeeded", nil, 1); err != nil || len(done) != 1 || done[0].Error != nil {
		t.Fatalf("a succeeded job listed: %+v (%v), want no error", done, err)
	}
	for id, want := range map[string]string{"job_00": "succeeded", "job_09": "running", "job_99": ""} {
		head, err := projections.ReadJobHead(ctx, pool, id)
		switch {
		case err != nil:
			t.Fatal(err)
		case want == "" && head != nil:
			t.Fatalf("%s: read %+v of a job never submitted", id, head)
		case want != "" && (head == nil || head.State != want || head.PositionsDone != len(fens) || head.CostUnits != 40):
			t.Fatalf("%s: head %+v, want %s with %d positions done and 40 units", id, head, want, len(fens))
		}
	}
	wantAside := map[string]int64{"accounts_v1": 3, "jobs_v1": 13}
	for name, n := range wantAside {
		if got := count(t, pool, `SELECT count(*) FROM set_aside_events WHERE projection = $1`, name); int64(got) != n {
			t.Fatalf("%s set %d events aside live, want %d: %v", name, got, n, liveAside)
		}
	}

	traced, trips := tracedPool(t, pool)
	for _, known := range []bool{true, false} {
		if !known {
			if _, err := pool.Exec(ctx, `DELETE FROM set_aside_events`); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range ps {
			topic := count(t, pool, `SELECT count(*) FROM events WHERE stream_type IN (SELECT unnest($1::text[]))`, streamTypes(p.Topic()))
			before := trips.n.Load()
			rep, err := projections.Rebuild(ctx, traced, p)
			if err != nil {
				t.Fatalf("rebuild %s: %v", p.Name(), err)
			}
			if rep.SetAside != wantAside[p.Name()] || rep.Applied+rep.SetAside != int64(topic) {
				t.Fatalf("rebuild %s (set-aside events known: %v): %+v of %d events", p.Name(), known, rep, topic)
			}
			// per chunk of 32: a read and a write, twice when the first attempt is
			// refused; a refused event costs a few more to find; and, whatever the
			// events, up to 16 to begin, empty the tables, set the checkpoint and commit
			// (disputes_v1 has none here)
			n := trips.n.Load() - before
			t.Logf("rebuild %s (set-aside events known: %v): %d round trips for %d events", p.Name(), known, n, topic)
			if (n-16)*2 > int64(topic) {
				t.Errorf("rebuild %s: more than a round trip for every second event", p.Name())
			}
		}
		if rebuilt := snapshot(t, pool, tables); !reflect.DeepEqual(live, rebuilt) {
			for _, table := range tables {
				if !reflect.DeepEqual(live[table], rebuilt[table]) {
					t.Errorf("set-aside events known: %v: rebuilt %s differs:\nlive    %v\nrebuilt %v", known, table, live[table], rebuilt[table])
				}
			}
			t.FailNow()
		}
		if aside := setAsideRows(t, pool); !reflect.DeepEqual(liveAside, aside) {
			t.Fatalf("set-aside events known: %v: set-aside events differ:\nlive    %v\nrebuilt %v", known, strings.Join(liveAside, "\n"), strings.Join(aside, "\n"))
		}
	}
	if rep, err := eventstore.Verify(ctx, pool); err != nil || rep.Tamper != nil {
		t.Fatalf("verify: %v %v", err, rep.Tamper)
	}
}

// streamTypes are the stream types of topic's events.
func streamTypes(topic string) []string {
	var out []string
	for t, to := range eventstore.Topics {
		if to == topic {
			out = append(out, t)
		}
	}
	return out
}
