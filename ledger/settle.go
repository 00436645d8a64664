package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"chessd/eventstore"
)

// settlement is one answered call waiting for the settler: its line of the key's next
// ChargesSettled.
type settlement struct {
	lease   *lease
	line    SettledCharge
	encoded []byte // line's JSON, encoded by the call, beside the other calls
	idem    *Stored
}

// maxSettleBatch bounds one group commit.
const maxSettleBatch = 512

// loop is the settler: it commits what is queued, Gather after a call comes or as soon
// as the previous commit is done (under load, the calls answered during one commit make
// up the next), and keeps the leases: renews this server's, releases idle ones,
// recovers expired ones of servers that died.
//
// Asked to stop (ctx ends, or Stop), it reserves nothing more and goes on settling and
// renewing until no reserved call is left (each settled or cancelled), StopGrace has
// passed or Stop's context ends; then the final drain (shutdown). A crashed meter
// (Crash) stops at once and forgives what it had not settled.
func (m *Meter) loop(ctx context.Context) {
	defer close(m.stopped)
	defer m.cursor.Close()
	tick := time.NewTicker(m.cfg.Housekeeping)
	defer tick.Stop()
	var waiting []*flushWait
	asked, keep := ctx.Done(), ctx
	var idle <-chan struct{}   // closed once no reserved call is left
	var grace <-chan time.Time // StopGrace after the stop was asked for
	var bound <-chan struct{}  // Stop's context
	stopping := func() {
		if idle != nil {
			return
		}
		keep = context.WithoutCancel(ctx) // renew while the reserved calls finish
		idle = m.beginStop()
		t := time.NewTimer(m.cfg.StopGrace)
		grace = t.C
	}
	for {
		var batch []*settlement
		select {
		case s := <-m.queue:
			batch = append(batch, s)
			m.gather(ctx)
		case done := <-m.flushReq:
			// every call answered before, queued or on its way to the queue (first in,
			// first out, as unsettled is)
			m.mu.Lock()
			left := len(m.unsettled)
			m.mu.Unlock()
			waiting = append(waiting, &flushWait{done: done, left: left})
		case <-tick.C:
			m.housekeeping(keep)
			continue
		case <-asked:
			asked = nil
			if m.crashed.Load() {
				return
			}
			stopping()
			continue
		case sctx := <-m.stopReq:
			bound = sctx.Done()
			stopping()
			continue
		case <-idle:
			m.shutdown(waiting)
			return
		case <-grace:
			m.shutdown(waiting)
			return
		case <-bound:
			m.shutdown(waiting)
			return
		}
		batch = m.drain(batch)
		waiting = m.settleBatch(ctx, batch, waiting)
	}
}

// settleBatch settles batch and answers the Flushes it completes.
func (m *Meter) settleBatch(ctx context.Context, batch []*settlement, waiting []*flushWait) []*flushWait {
	err := m.settle(ctx, batch)
	if err != nil {
		m.logger.Error("settle", "calls", len(batch), "err", err)
	}
	return slices.DeleteFunc(waiting, func(w *flushWait) bool { return w.settled(len(batch), err) })
}

// beginStop stops new reservations and returns a channel closed once no reserved call
// is left.
func (m *Meter) beginStop() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopping.Store(true)
	idle := make(chan struct{})
	if m.outstanding == 0 {
		close(idle)
	} else {
		m.idle = idle
	}
	return idle
}

// gather lets the answer of the call just queued leave before its settle begins, and
// more calls join the commit (MeterConfig.Gather). A settle goes on after ctx ends.
func (m *Meter) gather(ctx context.Context) {
	if m.cfg.Gather <= 0 {
		return
	}
	t := time.NewTimer(m.cfg.Gather)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// flushWait is a Flush waiting for the calls answered before it (left of them not yet
// settled); a backlog can take several batches.
type flushWait struct {
	done chan error
	left int
	err  error // the first failed settle of those
}

// settled counts a committed batch of n settlements and answers the Flush once its own
// are all in.
func (w *flushWait) settled(n int, err error) bool {
	w.left -= n
	if w.err == nil {
		w.err = err
	}
	if w.left > 0 {
		return false
	}
	w.done <- w.err
	return true
}

// drain adds whatever else is queued, up to a batch.
func (m *Meter) drain(batch []*settlement) []*settlement {
	for len(batch) < maxSettleBatch {
		select {
		case s := <-m.queue:
			batch = append(batch, s)
		default:
			return batch
		}
	}
	return batch
}

// Flush waits until every call settled before it is committed (tests, shutdown, the
// bench's count of charges), however many batches the backlog takes.
func (m *Meter) Flush(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case m.flushReq <- done:
	case <-m.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-m.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A settle commits within settleWithin of its oldest call's charged_at, by the meter's
// clock (the one charged_at is stamped with), or charges none of its calls: GET /usage's
// as_of, at least a minute old, relies on no charge committing later (httpapi
// asOfMargin).
//
//   - Attempts start until settleTrying after that charged_at, and each is cut there.
//   - A commit whose outcome is uncertain (the connection failed once COMMIT may have
//     been sent) is resolved until settleWithin: eventstore.Store.Settle ends the
//     transaction's backend before it reads the log, so nothing of it commits after the
//     answer.
//   - The transaction bounds itself in the database (settleBounds), so that one the
//     settler let go of ends there rather than commits later.
const (
	settleTrying = 20 * time.Second
	settleWithin = 30 * time.Second
)

// settleBounds are the settle's transaction's own limits, set by a statement ahead of
// its work in the same round trip (set_config local: undone at its end): a statement
// stops after 5 s (a lock wait behind a stuck transaction, its COMMIT already sent
// behind it), the session after 5 s idle in the transaction (between the pipelined
// path's two round trips, its COMMIT not yet come), and a statement whose client closed
// its connection (an attempt cut at its deadline) within a second, where it would
// otherwise go on to the COMMIT queued behind it once its locks came
// (client_connection_check_interval: PostgreSQL 14 and later where the server's
// platform can watch a socket for its peer closing: set only where a first settle found
// the database takes it, settleBounds). They cost about 7 µs a transaction, against
// about 1 ms for the commit of a one-call settle (BenchmarkMeterSettle).
const settleLimits = `SELECT set_config('statement_timeout', '5s', true),
	set_config('idle_in_transaction_session_timeout', '5s', true)`

// connectionCheck is the setting settleBounds adds where the database takes it (a
// variable: a test names one no server knows).
var connectionCheck = "client_connection_check_interval"

// settleBounds is the statement that sets the settle's transaction's limits: with
// client_connection_check_interval where the database takes it, which a transaction
// rolled back learns once. A server that does not know the setting (before 14), or
// refuses the value (a platform that cannot watch for the peer's close), would refuse
// every settle (a data exception, taken for a charge refused for what it writes: every
// call forgiven), so settles there go without it, said once in the log. A probe that
// fails otherwise (the database away) is tried again at the next settle.
func (m *Meter) settleBounds(ctx context.Context) string {
	if m.bounds != "" {
		return m.bounds
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT set_config($1, '1s', true)`, connectionCheck)
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		m.bounds = settleLimits + `, set_config('` + connectionCheck + `', '1s', true)`
	case errors.As(err, &pgErr) && (pgErr.Code == "22023" || pgErr.Code == "42704"): // a value refused, a setting unknown
		m.logger.Warn("the database refuses "+connectionCheck+": a settle cut at its deadline while it waits on a lock may still commit once the lock comes (docs/BILLING.md, Late charges)", "err", err)
		m.bounds = settleLimits
	default:
		return settleLimits
	}
	return m.bounds
}

// errLate says a settle's deadline passed before it committed (settleTrying).
var errLate = errors.New("ledger: the settle's deadline passed")

// settle commits a batch: one meter_settle_all of its calls (their units against their
// leases, and the answers of those with an Idempotency-Key) and, per key, one
// ChargesSettled of its calls charged, with its row in the ledger's read model. A
// transient failure is retried (the leases keep the units meanwhile) until the batch's
// deadline (settleTrying), then the calls are forgiven. A call whose lease is gone, or
// whose claim a retry took over, is not charged: forgiven, never charged past what was
// reserved nor twice. A batch refused for what it writes is settled call by call
// (settleRefused).
func (m *Meter) settle(ctx context.Context, batch []*settlement) error {
	if len(batch) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx) // bounded by the batch's deadline instead
	n := len(batch)
	leases, units := make([]string, n), make([]int64, n)
	scopes, keys, statuses, responses := make([]*string, n), make([]*string, n), make([]*int32, n), make([][]byte, n)
	for i, s := range batch {
		leases[i], units[i] = s.lease.id, s.line.Units
		if st := s.idem; st != nil {
			status := int32(st.Status)
			scopes[i], keys[i], statuses[i], responses[i] = &st.Scope, &st.Key, &status, st.Response
		}
	}
	// the latest charged_at: the settle counts no line in a period that ended before it
	// (migrations/0054), which a refund relies on (Credit)
	at, oldest := batch[0].line.ChargedAt, batch[0].line.ChargedAt
	for _, s := range batch {
		if s.line.ChargedAt.After(at) {
			at = s.line.ChargedAt
		}
		if s.line.ChargedAt.Before(oldest) {
			oldest = s.line.ChargedAt
		}
	}
	bounds := m.settleBounds(ctx)
	// meter_settle_all takes its locks in one order, whatever the order of the calls
	queue := func(strict bool) func(*pgx.Batch) {
		return func(b *pgx.Batch) {
			b.Queue(bounds)
			b.Queue(`SELECT meter_settle_all($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`, m.owner,
				leases, units, scopes, keys, statuses, responses, UnitPriceUSD, at, strict)
		}
	}
	appends := func(charged func(i int) bool) ([]eventstore.Appends, error) {
		type group struct {
			l       *lease
			lines   []SettledCharge
			encoded [][]byte
		}
		var groups []*group
		index := map[string]*group{}
		for i, s := range batch {
			if !charged(i) {
				continue
			}
			g := index[s.lease.keyID]
			if g == nil {
				g = &group{l: s.lease}
				index[s.lease.keyID] = g
				groups = append(groups, g)
			}
			g.lines, g.encoded = append(g.lines, s.line), append(g.encoded, s.encoded)
		}
		out := make([]eventstore.Appends, 0, len(groups))
		for _, g := range groups {
			e, payload, err := settledEvent(g.l.accountID, g.l.keyID, g.l.env, g.lines, g.encoded)
			if err != nil {
				return nil, err
			}
			md := eventstore.Metadata{AccountID: e.AccountID, KeyID: e.KeyID}
			out = append(out, eventstore.Appends{StreamID: Stream(e.KeyID), StreamType: StreamLedger,
				Events: []eventstore.New{{Type: e.EventType(), SchemaVersion: 1, Payload: e, Encoded: payload, Meta: &md}}})
		}
		return out, nil
	}
	forgiven := make([]bool, len(batch))
	started := time.Now()
	defer func() {
		m.logger.Debug("settled", "calls", len(batch), "ms", float64(time.Since(started).Microseconds())/1000)
	}()
	// on the meter's clock, which may not be the process's (tests)
	tryUntil, resolveUntil := oldest.Add(settleTrying), oldest.Add(settleWithin)
	until := func(t time.Time) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, t.Sub(m.now()))
	}
	var err error
	for attempt := 0; ; attempt++ {
		if !m.now().Before(tryUntil) {
			// The database stayed away or too slow: these answered calls are forgiven,
			// and their leases' units stay reserved until the leases expire or are
			// released. No attempt is under way: the last one failed for sure, or
			// its backend was ended (Store.Settle).
			err = errors.Join(errLate, err)
			m.logger.Error("settle gave up at its deadline; the calls are forgiven", "calls", len(batch),
				"oldest_charged_at", oldest, "err", err)
			m.forgive(batch, ForgivenLate)
			return err
		}
		actx, cancel := until(tryUntil)
		err = m.settleOnce(actx, batch, queue, appends, forgiven)
		cancel()
		if err == nil {
			break
		}
		if refused(err) {
			return m.settleRefused(ctx, batch, err)
		}
		var u *eventstore.UncertainCommitError
		if errors.As(err, &u) {
			rctx, cancel := until(resolveUntil)
			committed, serr := m.store.Settle(rctx, u)
			cancel()
			if serr != nil {
				// The outcome could not be learnt by settleWithin: the database stayed
				// out of reach. Another attempt could charge the calls twice (their
				// leases may hold their units once more), so there is none, and the
				// calls are forgiven in memory whatever the database holds, which is
				// safe both ways. forget takes their units off their leases' pending
				// and hands them to no call: units a committed charge spent are never
				// handed out again, and units it did not are left reserved in the
				// leases' rows (never past a budget) until the leases are given back
				// or expire. Their claims are no longer renewed: an answer stored with
				// the charge stands, an unanswered claim expires and a retry takes it
				// over. A commit, if any, is not late: it came before the attempt ended
				// (at settleTrying at the latest), or from a backend still at work then,
				// which its bounds (settleBounds) end within seconds of losing its
				// client. Only a network that holds the COMMIT back and delivers it
				// after settleWithin (a partition that heals while the backend waits
				// for the rest of its pipeline) could commit it later.
				err = errors.Join(err, serr)
				m.logger.Error("settle: the outcome of a commit could not be learnt by its deadline; the calls are forgiven, and may have been charged",
					"calls", len(batch), "oldest_charged_at", oldest, "err", err)
				m.forgive(batch, ForgivenUnknown)
				return err
			}
			if committed {
				break
			}
		}
		m.logger.Warn("settle failed; retrying", "calls", len(batch), "attempt", attempt, "err", err)
		time.Sleep(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second, max(tryUntil.Sub(m.now()), 0)))
	}
	if n := countTrue(forgiven); n > 0 {
		m.logger.Warn("calls whose lease was lost or whose Idempotency-Key a retry took over were not charged", "calls", n)
		countForgiven(ForgivenLost, n)
		for i, f := range forgiven {
			if f {
				// its lease may be gone: later calls take a new one, and its row, if
				// any, goes back (it is no longer renewed)
				m.retire(ctx, batch[i].lease)
			}
		}
	}
	for i, s := range batch {
		if !forgiven[i] {
			countCharge(s.line.Endpoint, s.line.Cached, s.line.Units, s.line.USD)
		}
	}
	m.forget(batch)
	return nil
}

// refused says a settle failed for what it writes, not for how: the ledger's read
// model refused a charge (postings that do not balance: eventstore.ErrRefused), or
// PostgreSQL refused a value (SQLSTATE class 22 data exception, 23 integrity, 54
// program limit). The transaction wrote nothing, and the same batch would fail again.
func refused(err error) bool {
	if errors.Is(err, eventstore.ErrRefused) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	class := pgErr.Code[:min(2, len(pgErr.Code))]
	return class == "22" || class == "23" || class == "54"
}

// settleRefused settles a refused batch, which committed nothing, one call at a time,
// so that only a call that is refused on its own is left out: forgiven (its answer
// stands), never charged, and the others are charged once.
func (m *Meter) settleRefused(ctx context.Context, batch []*settlement, err error) error {
	if len(batch) == 1 {
		s := batch[0]
		m.logger.Error("a charge the ledger refused is forgiven", "request_id", s.line.RequestID,
			"key_id", s.lease.keyID, "units", s.line.Units, "err", err)
		m.forgive(batch, ForgivenRefused)
		return err
	}
	m.logger.Warn("the ledger refused a settle; settling its calls one by one", "calls", len(batch), "err", err)
	var errs []error
	for _, s := range batch {
		errs = append(errs, m.settle(ctx, []*settlement{s}))
	}
	return errors.Join(errs...)
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// settleOnce is one attempt: the one-round-trip path when every lease holds, every
// claim is ours and nobody else appended since our last commit, else the checked,
// pipelined path, which reads which calls are charged (forgiven marks the others).
func (m *Meter) settleOnce(ctx context.Context, batch []*settlement, queue func(bool) func(*pgx.Batch),
	appends func(func(int) bool) ([]eventstore.Appends, error), forgiven []bool) error {
	clear(forgiven)
	all, err := appends(func(int) bool { return true })
	if err != nil {
		return fmt.Errorf("%w: %w", eventstore.ErrRefused, err)
	}
	_, err = m.store.Fast(ctx, &m.cursor, queue(true), all)
	if err == nil || !errors.Is(err, eventstore.ErrStale) {
		return err
	}
	var streams []string
	seen := map[string]bool{}
	for _, s := range batch {
		if id := Stream(s.lease.keyID); !seen[id] {
			seen[id] = true
			streams = append(streams, id)
		}
	}
	read := func(br pgx.BatchResults) ([]eventstore.Appends, error) {
		if _, err := br.Exec(); err != nil { // settleBounds: a failure tried again, never a refused charge
			return nil, fmt.Errorf("settle: its limits: %v", err)
		}
		var kept []bool
		if err := br.QueryRow().Scan(&kept); err != nil {
			return nil, fmt.Errorf("settle: %w", err)
		}
		if len(kept) != len(batch) {
			return nil, fmt.Errorf("settle: %d outcomes for %d calls", len(kept), len(batch))
		}
		for i, k := range kept {
			forgiven[i] = !k
		}
		charged, err := appends(func(i int) bool { return !forgiven[i] })
		if err != nil {
			return nil, fmt.Errorf("%w: %w", eventstore.ErrRefused, err)
		}
		return charged, nil
	}
	_, err = m.store.Pipelined(ctx, &m.cursor, streams, queue(false), read)
	return err
}

// forgive forgets a batch none of whose calls is charged, and counts them as reason
// says.
func (m *Meter) forgive(batch []*settlement, reason string) {
	countForgiven(reason, len(batch))
	m.forget(batch)
}

// forget drops the batch's units from the leases' pending counts once committed (or
// given up), and its claims from those renewed: stored with the charge, or forgiven.
func (m *Meter) forget(batch []*settlement) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range batch {
		s.lease.pending -= s.line.Units
		if s.idem != nil {
			delete(m.claims, claimKey{s.idem.Scope, s.idem.Key})
		}
	}
	// the queue is first in, first out, and so is unsettled
	m.unsettled = m.unsettled[min(len(batch), len(m.unsettled)):]
	close(m.settled)
	m.settled = make(chan struct{})
}

// housekeeping renews this server's leases and claims, gives back idle leases and
// recovers expired ones of other servers.
func (m *Meter) housekeeping(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL/3)
	defer cancel()
	// before the leases are listed: a lease topped up before it is on the list
	sent := time.Now()
	var idle []*lease
	m.mu.Lock()
	for lk, l := range m.leases {
		keep := m.cfg.LeaseIdle
		if l.full {
			keep = m.cfg.LeaseKeep
		}
		if l.inflight == 0 && l.filling == 0 && l.pending == 0 && time.Since(l.lastUsed) > keep {
			l.released = true
			delete(m.leases, lk)
			idle = append(idle, l)
		}
	}
	// Only what this server still uses is renewed: a row or claim it lost track of
	// (a failed release or Unclaim, a call forgiven) expires like a dead server's.
	leases := make([]string, 0, len(m.leases)+len(m.releasing))
	for _, l := range m.leases {
		leases = append(leases, l.id)
	}
	for l := range m.releasing {
		leases = append(leases, l.id)
	}
	claimed := make(map[claimKey]uint64, len(m.claims))
	scopes, keys := make([]string, 0, len(m.claims)), make([]string, 0, len(m.claims))
	for k, gen := range m.claims {
		claimed[k] = gen
		scopes, keys = append(scopes, k.scope), append(keys, k.key)
	}
	m.mu.Unlock()
	for _, l := range idle {
		m.releaseRow(ctx, l)
	}
	m.releaseKeyless(ctx, false)
	b := &pgx.Batch{}
	b.Queue(`UPDATE leases SET expires_at = now() + $2 WHERE owner = $1 AND lease_id = ANY ($3) RETURNING lease_id`, m.owner, m.cfg.LeaseTTL, leases)
	b.Queue(`UPDATE idempotency SET expires_at = now() + $2
		WHERE owner = $1 AND state = 'running' AND (scope, idem_key) IN (SELECT * FROM unnest($3::text[], $4::text[]))
		RETURNING scope, idem_key`, m.owner, m.cfg.LeaseTTL, scopes, keys)
	b.Queue(`SELECT coalesce(sum(meter_release(lease_id, NULL, $1)), 0) FROM
		(SELECT lease_id FROM leases WHERE expires_at < now() ORDER BY expires_at LIMIT 100) expired`, UnitPriceUSD)
	br := m.pool.SendBatch(ctx, b)
	renewed := map[string]bool{}
	var err1 error
	if rows, err := br.Query(); err != nil {
		err1 = err
	} else {
		var id string
		_, err1 = pgx.ForEachRow(rows, []any{&id}, func() error {
			renewed[id] = true
			return nil
		})
	}
	var err2 error
	if rows, err := br.Query(); err != nil {
		err2 = err
	} else {
		var k claimKey
		_, err2 = pgx.ForEachRow(rows, []any{&k.scope, &k.key}, func() error {
			delete(claimed, k) // still running and ours
			return nil
		})
	}
	var recovered int64
	err3 := br.QueryRow().Scan(&recovered)
	if err := errors.Join(err1, err2, err3, br.Close()); err != nil {
		if ctx.Err() == nil {
			m.logger.Warn("lease housekeeping", "err", err)
		}
		return
	}
	// A lease renewed is trusted a TTL more; one whose row was gone (another server gave
	// its units back: this one stalled or lost the database longer than LeaseTTL) hands
	// out nothing more. Only leases topped up before the list was made had a row.
	var gone []*lease
	m.mu.Lock()
	for _, l := range m.leases {
		switch {
		case renewed[l.id]:
			m.trust(l, sent)
		case !l.toppedAt.IsZero() && l.toppedAt.Before(sent) && !l.released:
			gone = append(gone, l)
		}
	}
	m.mu.Unlock()
	for _, l := range gone {
		m.logger.Warn("a lease's row was gone at its renewal: its units went back; it hands out nothing more", "lease", l.id)
		m.retire(ctx, l)
	}
	// A claim not renewed is answered (a job's, stored in its own transaction), given
	// back or taken over: not this server's to renew any more, unless claimed again.
	m.mu.Lock()
	for k, gen := range claimed {
		if m.claims[k] == gen {
			delete(m.claims, k)
		}
	}
	m.mu.Unlock()
	if recovered > 0 {
		m.logger.Info("released expired leases (a stopped server's, or rows given up on)", "units", recovered)
	}
}

// retire stops new calls from using l (later ones take a new lease) and releases it.
func (m *Meter) retire(ctx context.Context, l *lease) {
	m.mu.Lock()
	retired := !l.released
	if retired {
		l.released = true
		if lk := (leaseKey{l.keyID, l.day}); m.leases[lk] == l {
			delete(m.leases, lk)
		}
	}
	m.mu.Unlock()
	if retired {
		m.release(ctx, l)
	}
}

// releaseBeforeNext releases l, which no call may use any more, before the call that
// found it stale takes a new lease, when none of l's calls was still to settle as
// leaseFor let it go (it then gave l a given channel and noted it in m.giving, for the
// key's other calls to wait for): what l held is then the new lease's to take. A key's
// budget lowered to what it spent and holds (a handover of all the rest) otherwise
// refuses the key's next calls until the release lands in the background. With calls
// still to settle, l goes as release says. Only the call leaseFor handed l to as stale
// calls it, so given is closed once.
func (m *Meter) releaseBeforeNext(ctx context.Context, l *lease) {
	m.mu.Lock()
	given := l.given
	m.mu.Unlock()
	if given == nil {
		m.release(ctx, l)
		return
	}
	m.releaseRow(context.WithoutCancel(ctx), l)
	m.mu.Lock()
	if lk := (leaseKey{l.keyID, l.day}); m.giving[lk] == l {
		delete(m.giving, lk)
	}
	m.mu.Unlock()
	close(given)
}

// release ends a lease that no call may use any more, once its calls are settled; its
// row is renewed until then.
func (m *Meter) release(ctx context.Context, l *lease) {
	m.mu.Lock()
	m.releasing[l] = struct{}{}
	m.mu.Unlock()
	go func() {
		defer func() {
			m.mu.Lock()
			delete(m.releasing, l)
			m.mu.Unlock()
		}()
		// calls still holding it settle first; then its units go back
		for {
			m.mu.Lock()
			busy := l.inflight > 0 || l.pending > 0 || l.filling > 0
			m.mu.Unlock()
			if !busy {
				break
			}
			select {
			case <-time.After(20 * time.Millisecond):
			case <-m.stopped:
				return
			}
		}
		m.releaseRow(context.WithoutCancel(ctx), l)
	}()
}

func (m *Meter) releaseRow(ctx context.Context, l *lease) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := m.pool.Exec(ctx, `SELECT meter_release($1, $2, $3)`, l.id, m.owner, UnitPriceUSD); err != nil {
		m.logger.Warn("release lease (it will expire)", "lease", l.id, "err", err)
	}
}

// shutdown is the final drain: from its start a Settle is refused (Reservation.Settle,
// m.final), and every call settled before is received and committed, whether already
// queued or still on its way to the queue (each is counted in unsettled, under mu, before
// it is sent, and taken off once committed). Then every lease is given back.
func (m *Meter) shutdown(waiting []*flushWait) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.mu.Lock()
	m.final = true
	left, running := len(m.unsettled), m.outstanding
	m.mu.Unlock()
	if running > 0 {
		m.logger.Warn("the meter stops with calls still running: those answered from now on are not charged", "calls", running)
	}
	for left > 0 {
		batch := make([]*settlement, 0, min(left, maxSettleBatch))
		for len(batch) < cap(batch) {
			batch = append(batch, <-m.queue) // counted: it comes
		}
		left -= len(batch)
		waiting = m.settleBatch(ctx, batch, waiting)
	}
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	m.aheads.Wait() // their units are in the leases given back below
	m.mu.Lock()
	leases := m.leases
	m.leases = map[leaseKey]*lease{}
	m.mu.Unlock()
	for _, l := range leases {
		m.releaseRow(ctx, l)
	}
	m.releaseKeyless(ctx, true)
}
