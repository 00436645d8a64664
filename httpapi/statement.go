package httpapi

import (
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"chessd/domain"
	"chessd/ledger"
)

// The customer's statement: GET /usage/charges lists the charges of the calling key's
// env (or env=test for a live key) line by line, GET /charges/{id} explains one (of the
// key's env only). Both read the ledger's read model and the log through package ledger.

// statementRow is one charge of the statement, the same in JSON and CSV: CSV's columns
// are these fields' JSON names in this order, and each cell is the JSON value as text
// (null is an empty cell).
type statementRow struct {
	ChargeID      string  `json:"charge_id"`
	ChargedAt     string  `json:"charged_at"`
	RequestID     string  `json:"request_id"`
	KeyID         string  `json:"key_id"`
	Env           string  `json:"env"`
	Endpoint      string  `json:"endpoint"`
	Engine        string  `json:"engine"`
	Path          string  `json:"path"`
	Depth         int     `json:"depth"`
	MultiPV       int     `json:"multipv"`
	MoveTimeMS    *int    `json:"movetime_ms"`
	Positions     int     `json:"positions"`
	Cached        bool    `json:"cached"`
	Units         int64   `json:"units"`
	USD           string  `json:"usd"`
	Day           string  `json:"day"`
	JobID         *string `json:"job_id"`
	FEN           *string `json:"fen"`
	EventPosition int64   `json:"event_position"`
	CreditID      *string `json:"credit_id"` // set when the charge was credited back
	CreditedAt    *string `json:"credited_at"`
	CreditReason  *string `json:"credit_reason"`
}

func newStatementRow(c ledger.ChargeLine) statementRow {
	row := statementRow{
		ChargeID: c.ChargeID, ChargedAt: c.ChargedAt.UTC().Format(time.RFC3339Nano), RequestID: c.RequestID,
		KeyID: c.KeyID, Env: c.Env, Endpoint: c.Endpoint, Engine: c.Engine, Path: c.Path,
		Depth: c.Params.Depth, MultiPV: c.Params.MultiPV, Positions: c.Params.Positions, Cached: c.Cached,
		Units: c.Units, USD: usd(c.USD), Day: c.Day, EventPosition: c.Position,
	}
	if c.Params.MoveTimeMS > 0 {
		row.MoveTimeMS = &c.Params.MoveTimeMS
	}
	if c.CreditedAt != nil {
		at := c.CreditedAt.UTC().Format(time.RFC3339Nano)
		row.CreditID, row.CreditedAt, row.CreditReason = c.CreditID, &at, c.CreditReason
	}
	if c.Params.JobID != "" {
		row.JobID = &c.Params.JobID
	}
	if c.Params.FEN != "" {
		row.FEN = &c.Params.FEN
	}
	return row
}

// statementColumns are the CSV header: the JSON names of statementRow's fields.
var statementColumns = func() []string {
	t := reflect.TypeFor[statementRow]()
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Tag.Get("json")
	}
	return out
}()

// record is the row's CSV cells, in statementColumns order.
func (row statementRow) record() []string {
	v := reflect.ValueOf(row)
	out := make([]string, v.NumField())
	for i := range out {
		f := v.Field(i)
		if f.Kind() == reflect.Pointer {
			if f.IsNil() {
				continue
			}
			f = f.Elem()
		}
		switch f.Kind() {
		case reflect.String:
			out[i] = csvCell(f.String())
		case reflect.Int, reflect.Int64:
			out[i] = strconv.FormatInt(f.Int(), 10)
		case reflect.Bool:
			out[i] = strconv.FormatBool(f.Bool())
		default:
			panic(fmt.Sprintf("statementRow: no CSV form for %s", f.Kind()))
		}
	}
	return out
}

// statement answers GET /usage/charges: a page of the calling key's env's charges (or
// env=test for a live key), oldest first, with the totals of the whole filtered range;
// CSV when asked for with Accept: text/csv.
func (s *Server) statement(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	le := listEnvOf(key)
	sq, err := parseStatementQuery(r.URL.Query(), time.Now(), &le)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	env, err := le.show("charges")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sq.AccountID, sq.Env = key.AccountID(), env.String()
	st, err := ledger.ReadStatement(r.Context(), s.pool, sq)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rows := make([]statementRow, len(st.Charges))
	for i, c := range st.Charges {
		rows[i] = newStatementRow(c)
	}
	var next *string
	if st.Next != (ledger.Cursor{}) {
		c := ledger.EncodeCursor(st.Next)
		next = &c
		q := r.URL.Query()
		q.Set("cursor", c)
		w.Header().Set("Link", fmt.Sprintf(`<%s/usage/charges?%s>; rel="next"`, s.baseURL, q.Encode()))
	}
	w.Header().Set("Vary", "Accept")
	w.Header().Set("Cache-Control", "no-store")
	if !wantsCSV(acceptOf(r)) {
		writeJSON(w, http.StatusOK, map[string]any{
			"env": sq.Env, "charges": rows, "next_cursor": next,
			"total_calls": st.Calls, "total_units": st.Units, "total_usd": usd(st.USD),
			"total_credits": st.Credits, "total_credited_units": st.CreditedUnits, "total_credited_usd": usd(st.CreditedUSD),
			"total_net_units": st.Units - st.CreditedUnits, "total_net_usd": usd(st.USD.Sub(st.CreditedUSD)),
		})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="charges.csv"`)
	setTotals(h, "Statement-Total-", st.Calls, st.Units, st.USD, ledger.UsageCredits{
		Credits: st.Credits, CreditedUnits: st.CreditedUnits, CreditedUSD: st.CreditedUSD})
	w.WriteHeader(http.StatusOK)
	cw := csv.NewWriter(w)
	cw.Write(statementColumns) //nolint:errcheck // the client went away: Flush reports it
	for _, row := range rows {
		cw.Write(row.record()) //nolint:errcheck // as above
	}
	cw.Flush()
}

// parseStatementQuery reads and checks the statement's filters, every bad one at once.
// from and to are UTC dates (the charge's day, inclusive, as GET /usage has them) or
// RFC 3339 times (charged_at, from inclusive, to exclusive); by default the last 30
// days, as GET /usage. The env parameter goes to le.
func parseStatementQuery(q url.Values, now time.Time, le *listEnv) (ledger.StatementQuery, error) {
	var p domain.Problems
	sq := ledger.StatementQuery{Limit: ledger.DefaultStatementLimit}
	one := func(name string) (string, bool) { // each given at most once (declaredOnly)
		vs, ok := q[name]
		if !ok {
			return "", false
		}
		return vs[0], true
	}
	if v, ok := one("key_id"); ok {
		if !strings.HasPrefix(v, "key_") || len(v) > 64 {
			p.Add("key_id", "must be a key id (key_…)")
		}
		sq.KeyID = v
	}
	if v, ok := one("endpoint"); ok {
		if _, known := domain.ParseEndpoint(v); !known {
			p.Add("endpoint", "must be eval, bestmove, analyze or batch")
		}
		sq.Endpoint = v
	}
	if v, ok := one("env"); ok {
		le.read(&p, "env", v)
	}
	if v, ok := one("limit"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ledger.MaxStatementLimit {
			p.Add("limit", fmt.Sprintf("must be an integer from 1 to %d", ledger.MaxStatementLimit))
		}
		sq.Limit = n
	}
	if v, ok := one("cursor"); ok {
		after, err := ledger.DecodeCursor(v)
		var de *domain.Error
		if errors.As(err, &de) {
			p = append(p, de.Fields...)
		}
		sq.After = after
	}
	today := now.UTC().Truncate(24 * time.Hour)
	from, to := today.AddDate(0, 0, -30), today
	sq.FromDay, sq.ToDay = &from, &to
	// lo and hi are the instants the range spans, to refuse one that ends before it
	// starts. A to date is before from when its day ends at lo or earlier: the day
	// before a from date ends exactly at lo, which hi.Before(lo) let through.
	lo, hi := from, to.AddDate(0, 0, 1)
	toDay := true
	if v, ok := one("from"); ok {
		day, at, err := dayOrTime(v)
		switch {
		case err != nil:
			p.Add("from", err.Error())
		case at != nil:
			sq.FromDay, sq.Since, lo = nil, at, *at
		default:
			sq.FromDay, lo = day, *day
		}
	}
	if v, ok := one("to"); ok {
		day, at, err := dayOrTime(v)
		switch {
		case err != nil:
			p.Add("to", err.Error())
		case at != nil:
			sq.ToDay, sq.Until, hi, toDay = nil, at, *at, false
		default:
			sq.ToDay, hi = day, day.AddDate(0, 0, 1)
		}
	}
	if hi.Before(lo) || toDay && !hi.After(lo) {
		p.Add("to", "is before from")
	}
	if err := p.Err(); err != nil {
		return ledger.StatementQuery{}, err
	}
	return sq, nil
}

// dayOrTime reads a UTC date (YYYY-MM-DD) or an RFC 3339 time.
func dayOrTime(v string) (day, at *time.Time, err error) {
	// Year 0 parses in Go but is no date PostgreSQL knows: it answered 500.
	if d, err := time.Parse(time.DateOnly, v); err == nil && d.Year() >= 1 {
		return &d, nil, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.UTC().Year() >= 1 {
		t = t.UTC()
		return nil, &t, nil
	}
	return nil, nil, fmt.Errorf("must be a date (YYYY-MM-DD, UTC) or an RFC 3339 time, from year 1")
}

// explainCharge answers GET /charges/{id}: one charge of the calling key's env, from
// the event that recorded it. Another account's charge, or one of the other env, is
// 404 exactly like an unknown id.
func (s *Server) explainCharge(w http.ResponseWriter, r *http.Request) {
	key := principal(r.Context())
	x, err := ledger.ExplainCharge(r.Context(), s.pool, key.AccountID(), key.Env().String(), pathVar(r, "id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ref := func(e ledger.EventRef) map[string]any {
		m := map[string]any{"position": e.Position, "stream_id": e.StreamID, "version": e.Version, "type": e.Type,
			"recorded_at": e.RecordedAt.Format(time.RFC3339Nano), "hash": hex.EncodeToString(e.Hash)}
		if e.RequestID != "" {
			m["request_id"] = e.RequestID
		}
		if e.CausationID != "" {
			m["causation_id"] = e.CausationID
		}
		return m
	}
	event := ref(x.Event)
	event["hash_matches"] = x.HashMatches
	if x.Event.Type == "ChargesSettled" {
		event["line"] = x.Charge.Line
	}
	related := make([]map[string]any, len(x.Related))
	for i, e := range x.Related {
		related[i] = ref(e)
	}
	postings := make([]map[string]any, len(x.Postings))
	for i, p := range x.Postings {
		debit, credit := p.Debit.String(), p.Credit.String() // whole units
		if p.Currency == ledger.USD {
			debit, credit = usd(p.Debit), usd(p.Credit)
		}
		postings[i] = map[string]any{"book": p.Book, "account": p.Account, "currency": p.Currency, "debit": debit, "credit": credit}
	}
	keyView := map[string]any{
		"key_id":             x.Charge.KeyID,
		"spent_units_before": x.SpentBefore.Units, "spent_usd_before": usd(x.SpentBefore.USD),
		"spent_units_after": x.SpentAfter.Units, "spent_usd_after": usd(x.SpentAfter.USD),
		"budget_units": x.BudgetUnits, "budget_usd": nil,
		"budget_period": x.BudgetPeriod, "period_start": x.PeriodStart, "period_end": x.PeriodEnd,
		"remaining_units_before": nil, "remaining_units_after": nil, "remaining_usd_before": nil, "remaining_usd_after": nil,
	}
	if b := x.BudgetUnits; b != nil {
		keyView["remaining_units_before"] = *b - x.SpentBefore.Units
		keyView["remaining_units_after"] = *b - x.SpentAfter.Units
	}
	if b := x.BudgetUSD; b != nil {
		keyView["budget_usd"] = usd(*b)
		keyView["remaining_usd_before"] = usd(b.Sub(x.SpentBefore.USD))
		keyView["remaining_usd_after"] = usd(b.Sub(x.SpentAfter.USD))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"charge": newStatementRow(x.Charge), "event": event, "related_events": related,
		"postings": postings, "balanced": x.Balanced,
		"price": s.priceView(x.Price), "price_check": priceCheck(x.Price),
		"key": keyView,
		"account": map[string]any{"env": x.Charge.Env, "day": x.Charge.Day, "plan": x.Plan, "allowance_units": x.AllowanceUnits,
			"units_before": x.DayUnitsBefore, "units_after": x.DayUnitsAfter},
	})
}

// priceView is how the charge is priced by the published table (GET /price).
func (s *Server) priceView(pc ledger.PriceCheck) map[string]any {
	c := pc.Call
	q := url.Values{"endpoint": {string(c.Endpoint)}, "depth": {strconv.Itoa(c.Depth)}, "multipv": {strconv.Itoa(c.MultiPV)}}
	if c.MoveTimeMS > 0 {
		q.Set("movetime_ms", strconv.Itoa(c.MoveTimeMS))
	}
	switch c.Endpoint {
	case domain.EndpointBatch:
		q.Set("items", strconv.Itoa(c.Positions))
	case domain.EndpointAnalyze:
		q.Set("plies", strconv.Itoa(c.Positions))
	}
	rule := "fresh: units_per_position × positions"
	if pc.Cached {
		rule = "cached: cached_units_per_position × positions"
	}
	return map[string]any{
		"endpoint": c.Endpoint, "depth": c.Depth, "multipv": c.MultiPV, "movetime_ms": c.MoveTimeMS, "positions": c.Positions,
		"cached": pc.Cached, "units_per_position": pc.Quote.PerPosition, "cached_units_per_position": pc.Quote.CachedUnits,
		"depth_units_per_position": pc.DepthUnits, "movetime_capped": pc.Quote.PerPosition < pc.DepthUnits,
		"rule": rule, "units": pc.Units, "usd": usd(pc.USD), "unit_usd": ledger.UnitPriceUSD.StringFixed(6),
		"quote": s.baseURL + "/price?" + q.Encode(),
	}
}

// priceCheck says whether the charge is what the price table gives.
func priceCheck(pc ledger.PriceCheck) string {
	switch {
	case pc.Err != nil:
		return "cannot be priced again: the recorded inputs are outside the price table"
	case pc.Matches():
		return "matches"
	}
	return fmt.Sprintf("differs: charged %d units ($%s), the price table gives %d units ($%s), a difference of %+d units ($%s)",
		pc.ChargedUnits, usd(pc.ChargedUSD), pc.Units, usd(pc.USD), pc.ChargedUnits-pc.Units, usd(pc.ChargedUSD.Sub(pc.USD)))
}
