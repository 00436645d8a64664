package ledger

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"chessd/domain"
	"chessd/eventstore"
)

// The customer's statement: an account's charges line by line (GET /usage/charges),
// and one charge explained (GET /charges/{id}): what `chessd audit` tells an operator,
// read for the customer's own account and env only.

// Statement page sizes.
const (
	DefaultStatementLimit = 100
	MaxStatementLimit     = 1000
)

// Cursor is where a statement page ends: a charge's event position and its line in it.
type Cursor struct {
	Position int64
	Line     int
}

// EncodeCursor is the opaque cursor that continues a statement after the charge at c:
// URL-safe base64 of the position's 8 bytes and the line's 4, big-endian.
func EncodeCursor(c Cursor) string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], uint64(c.Position))
	binary.BigEndian.PutUint32(b[8:], uint32(c.Line))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// DecodeCursor reads a cursor made by EncodeCursor, or by the service before charges
// had lines (8 bytes: the position of a charge, line 0). Anything else, an edited
// cursor included, is a 400 naming the field `cursor`: every cursor has exactly one
// spelling, so a cursor that decodes is one the service handed out (for some account:
// it only says where to continue, and the account's filter is applied to what follows).
func DecodeCursor(s string) (Cursor, error) {
	bad := func() (Cursor, error) {
		return Cursor{}, domain.Invalid("cursor", "is not a cursor this service handed out (use next_cursor as given)")
	}
	// 8 or 12 bytes, unpadded; the decoder skips line breaks, which no cursor holds
	if len(s) != 11 && len(s) != 16 || strings.ContainsAny(s, "\r\n") {
		return bad()
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || (len(b) != 8 && len(b) != 12) {
		return bad()
	}
	c := Cursor{Position: int64(binary.BigEndian.Uint64(b))}
	if len(b) == 12 {
		line := binary.BigEndian.Uint32(b[8:])
		if line >= maxSettleBatch {
			return bad()
		}
		c.Line = int(line)
	}
	if c.Position <= 0 {
		return bad()
	}
	return c, nil
}

// ChargeLine is one charge as the statement shows it: a row of the charges read model,
// or the UnitsCharged event it was projected from.
type ChargeLine struct {
	Position  int64 // of the UnitsCharged or ChargesSettled event that recorded it
	Line      int   // its line in a ChargesSettled (0 in a UnitsCharged)
	ChargeID  string
	RequestID string
	KeyID     string
	Env       string
	Day       string // the UTC day whose allowance it drew on (a job's: the day it was accepted)
	ChargedAt time.Time
	Endpoint  string
	Engine    string
	Path      string
	Params    Params
	Cached    bool
	Units     int64
	USD       decimal.Decimal
	// The charge's credit, when it was credited back (a refund, an accepted dispute).
	CreditID     *string
	CreditedAt   *time.Time
	CreditReason *string
}

// StatementQuery selects an account's charges in one env. Days bound the UTC date of
// the charge's charged_at (as GET /usage does in its default zone), times charged_at
// itself; each bound is optional.
type StatementQuery struct {
	AccountID string
	Env       string // "live" or "test": a statement is one book
	KeyID     string // "" for every key
	Endpoint  string // "" for every endpoint
	FromDay   *time.Time
	ToDay     *time.Time // inclusive
	Since     *time.Time // charged_at ≥ Since
	Until     *time.Time // charged_at < Until
	After     Cursor     // a decoded cursor: only charges after this one
	Limit     int        // 1..MaxStatementLimit
}

// Statement is one page of charges, oldest first, and the totals of the whole range.
type Statement struct {
	Charges []ChargeLine
	// Next is the cursor of the next page (the last charge on this one), zero when this
	// page reaches the end.
	Next  Cursor
	Calls int64 // every charge of the range, not just this page
	Units int64
	USD   decimal.Decimal
	// What of those charges was credited back.
	Credits       int64
	CreditedUnits int64
	CreditedUSD   decimal.Decimal
}

// TxStarter begins transactions: a pool.
type TxStarter interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// ReadModelTables are the tables of the ledger's read model, the rollups included: what
// a rebuild replaces (projections.Ledger) and readOnly waits for. (ledger_entries, the
// postings, is a view of the events: nothing to rebuild.)
var ReadModelTables = []string{"charges", "charge_batches", "charge_batch_hours", "credits", "usage_hours", "usage_key_hours"}

// lockReadModel takes every table of the read model in ACCESS SHARE mode.
var lockReadModel = `LOCK TABLE ` + strings.Join(ReadModelTables, ", ") + ` IN ACCESS SHARE MODE`

// readOnly runs fn in one read-only snapshot, so that what it reads is one moment of
// the ledger (a page and its totals agree). It first waits for a rebuild swapping in
// the read model's tables (projections' shadow), whose rows a snapshot taken before the
// swap would not see: the lock statement takes no snapshot, the first read does.
func readOnly(ctx context.Context, db TxStarter, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockReadModel); err != nil {
			return err
		}
		return fn(tx)
	})
}

// statementFilter is the WHERE clause of a statement on charge_lines(), without the
// cursor; its parameters are $1..$8. Each bound on charged_at also bounds the batch's
// times (first_at, last_at), which finds the batches by their index.
const statementFilter = `account_id = $1 AND env = $2
	AND ($3 = '' OR key_id = $3) AND ($4 = '' OR endpoint = $4)
	AND ($5::date IS NULL OR (charged_at >= $5::date::timestamp AT TIME ZONE 'UTC' AND last_at >= $5::date::timestamp AT TIME ZONE 'UTC'))
	AND ($6::date IS NULL OR (charged_at < ($6::date + 1)::timestamp AT TIME ZONE 'UTC' AND first_at < ($6::date + 1)::timestamp AT TIME ZONE 'UTC'))
	AND ($7::timestamptz IS NULL OR (charged_at >= $7 AND last_at >= $7))
	AND ($8::timestamptz IS NULL OR (charged_at < $8 AND first_at < $8))`

const chargeLineColumns = `position, line, charge_id, request_id, key_id, env, to_char(day, 'YYYY-MM-DD'), charged_at,
	endpoint, engine, path, params::text, cached, units, usd,
	(SELECT r.credit_id FROM credits r WHERE r.charge_position = charges.position AND r.charge_line = charges.line),
	(SELECT r.credited_at FROM credits r WHERE r.charge_position = charges.position AND r.charge_line = charges.line),
	(SELECT r.reason FROM credits r WHERE r.charge_position = charges.position AND r.charge_line = charges.line)`

// ReadStatement reads one page of an account's charges in position order, the order in
// which they were committed: a charge committed later always has a higher position, so
// a client paging with the cursor gets every charge of its range exactly once, while
// new ones arrive at the end.
func ReadStatement(ctx context.Context, db TxStarter, sq StatementQuery) (Statement, error) {
	if sq.Limit < 1 || sq.Limit > MaxStatementLimit {
		return Statement{}, fmt.Errorf("statement: limit %d out of range", sq.Limit)
	}
	if sq.Env == "" {
		return Statement{}, errors.New("statement: no env")
	}
	day := func(t *time.Time) any {
		if t == nil {
			return nil
		}
		return t.UTC().Format(time.DateOnly)
	}
	args := []any{sq.AccountID, sq.Env, sq.KeyID, sq.Endpoint, day(sq.FromDay), day(sq.ToDay), sq.Since, sq.Until}
	st := Statement{USD: decimal.Zero, CreditedUSD: decimal.Zero}
	err := readOnly(ctx, db, func(tx pgx.Tx) error {
		lines, err := statementPage(ctx, tx, args, sq.After, sq.Limit+1)
		if err != nil {
			return err
		}
		if len(lines) > sq.Limit {
			lines = lines[:sq.Limit]
			st.Next = Cursor{Position: lines[len(lines)-1].Position, Line: lines[len(lines)-1].Line}
		}
		st.Charges = lines
		return statementTotals(ctx, tx, sq, args, &st)
	})
	if err != nil {
		return Statement{}, fmt.Errorf("statement: %w", err)
	}
	return st, nil
}

// statementEvents are the next events after a position ($8) that may hold charges of a
// statement, up to $9 of them (a charges row or a batch each), with how many charges
// each holds: the parameters of statementFilter but for the endpoint, which only lines
// have, each one less from $4 on.
const statementEvents = `SELECT position, lines FROM (
		SELECT position, 1::bigint AS lines FROM charges WHERE account_id = $1 AND env = $2 AND ($3 = '' OR key_id = $3) AND position > $8
			AND ($4::date IS NULL OR charged_at >= $4::date::timestamp AT TIME ZONE 'UTC')
			AND ($5::date IS NULL OR charged_at < ($5::date + 1)::timestamp AT TIME ZONE 'UTC')
			AND ($6::timestamptz IS NULL OR charged_at >= $6) AND ($7::timestamptz IS NULL OR charged_at < $7)
		UNION ALL
		SELECT position, lines FROM charge_batches WHERE account_id = $1 AND env = $2 AND ($3 = '' OR key_id = $3) AND position > $8
			AND ($4::date IS NULL OR last_at >= $4::date::timestamp AT TIME ZONE 'UTC')
			AND ($5::date IS NULL OR first_at < ($5::date + 1)::timestamp AT TIME ZONE 'UTC')
			AND ($6::timestamptz IS NULL OR last_at >= $6) AND ($7::timestamptz IS NULL OR first_at < $7)
	) x ORDER BY position LIMIT $9`

// statementPage reads up to n charges of a statement (args are statementFilter's) after
// the cursor, in order. Each round reads the lines of the fewest next events that hold
// as many charges as the page still needs, so a page costs what its charges do, however
// many the account has after it; a filter that keeps few of an event's lines (an
// endpoint) takes more rounds.
func statementPage(ctx context.Context, tx pgx.Tx, args []any, after Cursor, n int) ([]ChargeLine, error) {
	type event struct{ position, lines int64 }
	var lines []ChargeLine
	for start := after.Position - 1; len(lines) < n; { // the cursor's own event on
		rows, err := tx.Query(ctx, statementEvents, args[0], args[1], args[2], args[4], args[5], args[6], args[7], start, n)
		if err != nil {
			return nil, err
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (event, error) {
			var e event
			return e, r.Scan(&e.position, &e.lines)
		})
		if err != nil || len(events) == 0 {
			return lines, err
		}
		var positions []int64
		for held := int64(0); len(positions) < len(events) && held < int64(n-len(lines)); {
			e := events[len(positions)]
			positions, held = append(positions, e.position), held+e.lines
		}
		rows, err = tx.Query(ctx, `SELECT `+chargeLineColumns+` FROM charge_lines() charges WHERE `+statementFilter+`
			AND position = ANY($9) AND (position, line) > ($10, $11) ORDER BY position, line LIMIT $12`,
			append(args, positions, after.Position, after.Line, n-len(lines))...)
		if err != nil {
			return nil, err
		}
		more, err := pgx.CollectRows(rows, scanChargeLine)
		if err != nil {
			return nil, err
		}
		lines = append(lines, more...)
		if len(positions) == len(events) && len(events) < n {
			break // the account's last events
		}
		start = positions[len(positions)-1]
	}
	return lines, nil
}

func scanChargeLine(r pgx.CollectableRow) (ChargeLine, error) {
	var c ChargeLine
	var params string
	err := r.Scan(&c.Position, &c.Line, &c.ChargeID, &c.RequestID, &c.KeyID, &c.Env, &c.Day, &c.ChargedAt,
		&c.Endpoint, &c.Engine, &c.Path, &params, &c.Cached, &c.Units, &c.USD, &c.CreditID, &c.CreditedAt, &c.CreditReason)
	if err != nil {
		return c, err
	}
	c.ChargedAt = c.ChargedAt.UTC()
	if err := json.Unmarshal([]byte(params), &c.Params); err != nil {
		return c, fmt.Errorf("charge %s: params: %w", c.ChargeID, err)
	}
	return c, nil
}

// PriceCheck is a charge priced again from its recorded inputs with Quote, the
// function that priced it and that GET /price publishes.
type PriceCheck struct {
	Call  domain.Call // the recorded inputs, as Quote takes them
	Quote Price       // Quote(Call)
	// DepthUnits is the fresh price of one position at the depth alone: above
	// Quote.PerPosition when the movetime limit made it cheaper.
	DepthUnits int64
	Cached     bool            // charged the cached price
	Units      int64           // what the price table gives for this charge
	USD        decimal.Decimal // Units at the unit price
	// Charged is what was charged; Err is why the inputs cannot be priced (a charge
	// recorded with inputs Quote refuses), leaving Units and USD zero.
	ChargedUnits int64
	ChargedUSD   decimal.Decimal
	Err          error
}

// Matches says whether what was charged is what the price table gives.
func (p PriceCheck) Matches() bool {
	return p.Err == nil && p.Units == p.ChargedUnits && p.USD.Equal(p.ChargedUSD)
}

// Reprice prices a recorded charge again: the fresh price of its positions, or the
// cached price per position when it was served without a search, as the meter and the
// job executor charge them.
func Reprice(c ChargeLine) PriceCheck {
	call := domain.Call{Endpoint: domain.Endpoint(c.Endpoint), Depth: c.Params.Depth, MultiPV: c.Params.MultiPV,
		MoveTimeMS: c.Params.MoveTimeMS, Positions: c.Params.Positions}
	pc := PriceCheck{Call: call, Cached: c.Cached, ChargedUnits: c.Units, ChargedUSD: c.USD, USD: decimal.Zero}
	q, err := Quote(call)
	if err != nil {
		pc.Err = err
		return pc
	}
	depthOnly := call
	depthOnly.MoveTimeMS, depthOnly.Positions = 0, 1
	d, err := Quote(depthOnly)
	if err != nil {
		pc.Err = err
		return pc
	}
	pc.Quote, pc.DepthUnits = q, d.PerPosition
	pc.Units = q.Charged(c.Cached)
	pc.USD = UnitsUSD(pc.Units)
	return pc
}

// EventRef names one event of the log without its payload.
type EventRef struct {
	Position    int64
	StreamID    string
	Version     int64
	Type        string
	RecordedAt  time.Time
	Hash        []byte
	RequestID   string
	CausationID string
}

func refOf(e eventstore.Event) EventRef {
	m := e.Meta()
	return EventRef{Position: e.Position, StreamID: e.StreamID, Version: e.Version, Type: e.Type,
		RecordedAt: e.RecordedAt.UTC(), Hash: e.Hash, RequestID: m.RequestID, CausationID: m.CausationID}
}

// Spend is a key's charges up to a point.
type Spend struct {
	Units int64
	USD   decimal.Decimal
}

// Explanation is one charge explained from the log.
type Explanation struct {
	// Charge is from the event itself (a UnitsCharged, or a ChargesSettled's line),
	// with its credit, if any, as the statement shows it.
	Charge ChargeLine
	Event  EventRef // that event
	// HashMatches: the event's hash covers its content and its predecessor's hash, as
	// `chessd verify` checks for the whole log.
	HashMatches bool
	// Related are the other events of the charge's request, in log order: for a job's
	// position, the job's events up to the one that recorded this position (the
	// submission with its request id, the start); for a single call, any event
	// carrying its request id.
	Related  []EventRef
	Postings []Posting
	Balanced bool
	Price    PriceCheck
	// The key's charges before and after this one within its budget's period that holds
	// the charge (its whole life for a total budget), and its budgets as they stood
	// when it was charged (folded from the key's and the account's events before it).
	SpentBefore, SpentAfter Spend
	BudgetUnits             *int64
	BudgetUSD               *decimal.Decimal
	BudgetPeriod            domain.BudgetPeriod
	PeriodStart, PeriodEnd  *time.Time // nil for a total budget
	// The account's charges in this env on the charge's day, before and after it, and
	// the daily allowance of the plan it was on then.
	Plan                          string
	DayUnitsBefore, DayUnitsAfter int64
	AllowanceUnits                int64
}

// ExplainCharge explains the charge chargeID of accountID in env. A charge of another
// account or env is a domain.CodeNotFound error, exactly like an unknown id.
func ExplainCharge(ctx context.Context, db TxStarter, accountID, env, chargeID string) (Explanation, error) {
	var x Explanation
	notFound := domain.Errorf(domain.CodeNotFound, "no charge %q", chargeID)
	err := readOnly(ctx, db, func(tx pgx.Tx) error {
		// the line item as the statement reads it, whose credit (from the credits
		// table) the explanation shows with the event's own line
		rows, err := tx.Query(ctx, `SELECT `+chargeLineColumns+` FROM charge_lines() charges WHERE `+chargeByID+` AND account_id = $3 AND env = $4`,
			append(chargeIDArgs(chargeID), accountID, env)...)
		if err != nil {
			return err
		}
		item, err := pgx.CollectExactlyOneRow(rows, scanChargeLine)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound
		}
		if err != nil {
			return err
		}
		pos, line := item.Position, item.Line
		// the event and its predecessor, if any (positions have no gaps)
		from := max(0, pos-2)
		evs, err := eventstore.ReadFrom(ctx, tx, from, int(pos-from))
		if err != nil {
			return err
		}
		if len(evs) == 0 || evs[len(evs)-1].Position != pos {
			return fmt.Errorf("charge %s: no event at position %d", chargeID, pos)
		}
		ev := evs[len(evs)-1]
		var prev []byte
		if len(evs) == 2 {
			prev = evs[0].Hash
		}
		x.Event, x.HashMatches = refOf(ev), bytes.Equal(eventstore.ChainHash(prev, &ev), ev.Hash)
		d, err := domain.Decode(ev.Type, ev.SchemaVersion, ev.Payload)
		if err != nil {
			return fmt.Errorf("charge %s: %w", chargeID, err)
		}
		lines := chargeLines(pos, d)
		if line >= len(lines) || lines[line].ChargeID != chargeID {
			return fmt.Errorf("charge %s: position %d holds %s, not the charge", chargeID, pos, ev.Type)
		}
		x.Charge = lines[line]
		x.Charge.CreditID, x.Charge.CreditedAt, x.Charge.CreditReason = item.CreditID, item.CreditedAt, item.CreditReason
		var accountOf string
		switch e := d.(type) {
		case *UnitsCharged:
			x.Postings, x.Balanced, accountOf = e.Postings, Balanced(e.Postings), e.AccountID
		case *ChargesSettled:
			// the line's own share of the event's postings; Balanced covers the whole event
			t, err := ChargeTransaction(e.AccountID, e.Env, e.KeyID, x.Charge.Units, x.Charge.USD)
			if err != nil {
				return fmt.Errorf("charge %s: %w", chargeID, err)
			}
			x.Postings, x.Balanced, accountOf = t.Postings(), e.check() == nil, e.AccountID
		}
		x.Price = Reprice(x.Charge)
		if x.Related, err = relatedEvents(ctx, tx, x.Charge, accountOf); err != nil {
			return err
		}
		if err := x.balances(ctx, tx, accountID, lines[:line]); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, notFound) {
			return Explanation{}, notFound
		}
		return Explanation{}, fmt.Errorf("explain charge: %w", err)
	}
	return x, nil
}

// relatedEvents finds the other events of the charge's request.
func relatedEvents(ctx context.Context, tx pgx.Tx, c ChargeLine, accountID string) ([]EventRef, error) {
	out := []EventRef{}
	if c.Params.JobID != "" {
		evs, err := eventstore.Load(ctx, tx, domain.JobStream(c.Params.JobID))
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			m := e.Meta()
			if e.Type == "JobPositionAnalysed" && m.CausationID != c.ChargeID {
				continue // another position's
			}
			out = append(out, refOf(e))
			if e.Type == "JobPositionAnalysed" {
				break // the record of this position: what followed did not lead to it
			}
		}
		return out, nil
	}
	// Request ids may be chosen by the client (X-Request-Id) and reused: only the events
	// the charge's own key made (of this account and env) count.
	rows, err := tx.Query(ctx, `SELECT position FROM events
		WHERE (metadata ->> 'request_id') = $1 AND event_type <> 'UnitsCharged' AND (metadata ->> 'account_id') = $2
			AND (metadata ->> 'key_id') = $3
		ORDER BY position`, c.RequestID, accountID, c.KeyID)
	if err != nil {
		return nil, err
	}
	positions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	for _, p := range positions {
		evs, err := eventstore.ReadFrom(ctx, tx, p-1, 1)
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			out = append(out, refOf(e))
		}
	}
	return out, nil
}

// balances fills in the key's spend and budgets and the account's day around the
// charge; earlier are the lines before it in its own event.
func (x *Explanation) balances(ctx context.Context, tx pgx.Tx, accountID string, earlier []ChargeLine) error {
	c := x.Charge
	keyEvs, err := eventsBefore(ctx, tx, domain.KeyStream(c.KeyID), c.Position)
	if err != nil {
		return err
	}
	k := domain.RehydrateKey(keyEvs)
	x.BudgetUnits, x.BudgetUSD, x.BudgetPeriod = k.BudgetUnits(), k.BudgetUSD(), k.BudgetPeriod()
	acctEvs, err := eventsBefore(ctx, tx, domain.AccountStream(accountID), c.Position)
	if err != nil {
		return err
	}
	acct := domain.RehydrateAccount(acctEvs)
	plan := acct.Plan()
	x.Plan, x.AllowanceUnits = plan.String(), plan.Limits().UnitsPerDay
	if x.BudgetPeriod != domain.PeriodTotal {
		// the period of the account's zone as it stood then that holds the charge, the
		// bounds the meter keeps (budget_period_bounds); a zone changed within that
		// period took effect at its end, so the old zone's bounds are off for it alone
		var start, end time.Time
		if err := tx.QueryRow(ctx, `SELECT period_start, period_end FROM budget_period_bounds($1, $2, $3)`,
			string(x.BudgetPeriod), acct.Timezone(), c.ChargedAt).Scan(&start, &end); err != nil {
			return fmt.Errorf("budget period: %w", err)
		}
		x.PeriodStart, x.PeriodEnd = &start, &end
	}
	// Charges before this one: those of earlier events, summed in the database, then
	// the earlier lines of its own event. A batch wholly in the period (or day) counts by
	// its sums; only the lines of one across the period's start (or of several days) are
	// read from the log, so the sums cost no JSON per line of the key's history (last_at
	// as well as first_at: the index on it finds a period's batches).
	err = tx.QueryRow(ctx, `SELECT coalesce(sum(units), 0), coalesce(sum(usd), 0) FROM (
			SELECT units, usd FROM charges
			 WHERE account_id = $1 AND key_id = $2 AND position < $3 AND ($4::timestamptz IS NULL OR charged_at >= $4)
			UNION ALL
			SELECT units, usd FROM charge_batches
			 WHERE account_id = $1 AND key_id = $2 AND position < $3 AND ($4::timestamptz IS NULL OR (first_at >= $4 AND last_at >= $4))
			UNION ALL
			SELECT units, usd FROM charge_lines()
			 WHERE account_id = $1 AND key_id = $2 AND position < $3 AND first_at < $4 AND last_at >= $4 AND charged_at >= $4) s`,
		accountID, c.KeyID, c.Position, x.PeriodStart).Scan(&x.SpentBefore.Units, &x.SpentBefore.USD)
	if err != nil {
		return fmt.Errorf("key spend: %w", err)
	}
	err = tx.QueryRow(ctx, `SELECT coalesce(sum(units), 0) FROM (
			SELECT units FROM charges WHERE account_id = $1 AND env = $2 AND day = $3::date AND position < $4
			UNION ALL
			SELECT units FROM charge_batches
			 WHERE account_id = $1 AND env = $2 AND first_day = $3::date AND last_day = $3::date AND position < $4
			UNION ALL
			SELECT units FROM charge_lines()
			 WHERE account_id = $1 AND env = $2 AND day = $3::date AND first_day <= $3::date AND last_day >= $3::date
			   AND first_day < last_day AND position < $4) s`,
		accountID, c.Env, c.Day, c.Position).Scan(&x.DayUnitsBefore)
	if err != nil {
		return fmt.Errorf("day use: %w", err)
	}
	// Less what credits gave back before it, as the meter counts (Credit): a credit
	// gives a key's period back what its charge took when that charge is in the period,
	// and a day back what its charge took of it. Before the charge, such a credit's
	// charge is in the charge's own period.
	var back Spend
	var dayBack int64
	err = tx.QueryRow(ctx, `SELECT coalesce(sum(cr.units) FILTER (WHERE cr.key_id = $2 AND ($5::timestamptz IS NULL OR
				(SELECT l.charged_at FROM charge_lines() l WHERE l.position = cr.charge_position AND l.charge_id = cr.charge_id) >= $5)), 0),
			coalesce(sum(cr.usd) FILTER (WHERE cr.key_id = $2 AND ($5::timestamptz IS NULL OR
				(SELECT l.charged_at FROM charge_lines() l WHERE l.position = cr.charge_position AND l.charge_id = cr.charge_id) >= $5)), 0),
			coalesce(sum(cr.units) FILTER (WHERE cr.env = $3 AND cr.day = $6::date), 0)
		FROM credits cr WHERE cr.account_id = $1 AND cr.position < $4 AND (cr.key_id = $2 OR (cr.env = $3 AND cr.day = $6::date))`,
		accountID, c.KeyID, c.Env, c.Position, x.PeriodStart, c.Day).Scan(&back.Units, &back.USD, &dayBack)
	if err != nil {
		return fmt.Errorf("credits before: %w", err)
	}
	x.SpentBefore.Units, x.SpentBefore.USD = x.SpentBefore.Units-back.Units, x.SpentBefore.USD.Sub(back.USD)
	x.DayUnitsBefore -= dayBack
	for _, l := range earlier {
		if x.PeriodStart == nil || !l.ChargedAt.Before(*x.PeriodStart) {
			x.SpentBefore.Units, x.SpentBefore.USD = x.SpentBefore.Units+l.Units, x.SpentBefore.USD.Add(l.USD)
		}
		if l.Day == c.Day {
			x.DayUnitsBefore += l.Units
		}
	}
	x.SpentAfter.Units, x.SpentAfter.USD = x.SpentBefore.Units+c.Units, x.SpentBefore.USD.Add(c.USD)
	x.DayUnitsAfter = x.DayUnitsBefore + c.Units
	return nil
}

// eventsBefore decodes the events of stream appended before position.
func eventsBefore(ctx context.Context, q eventstore.Querier, stream string, position int64) ([]domain.Event, error) {
	stored, err := eventstore.Load(ctx, q, stream)
	if err != nil {
		return nil, err
	}
	var out []domain.Event
	for _, s := range stored {
		if s.Position >= position {
			break
		}
		e, err := domain.Decode(s.Type, s.SchemaVersion, s.Payload)
		if err != nil {
			return nil, fmt.Errorf("stream %s version %d: %w", stream, s.Version, err)
		}
		out = append(out, e)
	}
	return out, nil
}
