package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"chessd/commands"
	"chessd/domain"
	"chessd/eventstore"
	"chessd/ledger"
	"chessd/projections"
)

// parseAudit reads audit's key and days.
func parseAudit(fs *flag.FlagSet, args []string) (action, error) {
	keyID := fs.String("key", "", "key id (key_...)")
	fromS := fs.String("from", "", "first day, YYYY-MM-DD (UTC)")
	toS := fs.String("to", "", "last day, YYYY-MM-DD (UTC)")
	if _, err := parseArgs(fs, args, 0); err != nil {
		return nil, err
	}
	if *keyID == "" || *fromS == "" || *toS == "" {
		return nil, errors.New("--key, --from and --to are required")
	}
	from, err1 := time.Parse(time.DateOnly, *fromS)
	to, err2 := time.Parse(time.DateOnly, *toS)
	if err1 != nil || err2 != nil {
		return nil, errors.New("--from and --to are dates, YYYY-MM-DD")
	}
	if from.After(to) {
		return nil, fmt.Errorf("--from %s is after --to %s", *fromS, *toS)
	}
	return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
		return audit(ctx, db, *keyID, from, to, out)
	}), nil
}

// audit prints every charge and credit of one key charged (credited) in a range of UTC
// days, from the key's ledger stream (the events themselves, not a read model), with a
// running total net of credits: what GET /usage says for those days.
func audit(ctx context.Context, db *database, keyID string, from, to time.Time, out io.Writer) error {
	// a key never created has no charges either: say so rather than total nothing
	if v, err := eventstore.StreamVersion(ctx, db.pool, domain.KeyStream(keyID)); err != nil {
		return err
	} else if v == 0 {
		return fmt.Errorf("audit: no key %q in the event log", keyID)
	}
	evs, err := eventstore.Load(ctx, db.pool, ledger.Stream(keyID))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "charges of %s from %s to %s (UTC days), from the event log\n", keyID, from.Format(time.DateOnly), to.Format(time.DateOnly))
	fmt.Fprintf(out, "%-8s %-27s %-28s %-28s %-9s %-38s %-14s %-6s %7s %10s %9s %11s\n",
		"position", "charged_at", "charge_id", "request_id", "endpoint", "params", "engine/path", "cached", "units", "usd", "total", "total_usd")
	var n, units int64
	usd := decimal.Zero
	inRange := func(at time.Time) bool { // the UTC days of /usage's default calendar
		day := at.UTC().Truncate(24 * time.Hour)
		return !day.Before(from) && !day.After(to)
	}
	for _, e := range evs {
		ev, err := domain.Decode(e.Type, e.SchemaVersion, e.Payload)
		if err != nil {
			return err
		}
		if cr, ok := ev.(*ledger.UnitsCredited); ok && inRange(cr.CreditedAt) {
			if !ledger.Balanced(cr.Postings) {
				return fmt.Errorf("position %d: postings do not balance", e.Position)
			}
			units -= cr.Units
			usd = usd.Sub(cr.USD)
			fmt.Fprintf(out, "%-8d %-27s %-28s %-28s %-9s %-38s %-14s %-6s %7d %10s %9d %11s\n",
				e.Position, cr.CreditedAt.Format(time.RFC3339Nano), cr.CreditID, "credits "+cr.ChargeID[:min(len(cr.ChargeID), 20)], "credit",
				truncate(cr.Reason, 38), truncate(cr.Actor, 14), "", -cr.Units, cr.USD.Neg().StringFixed(6), units, usd.StringFixed(6))
			continue
		}
		charges, err := ledger.ChargesOf(e.Position, ev) // a UnitsCharged's one, a ChargesSettled's lines
		if err != nil {
			return err
		}
		for _, c := range charges {
			if !inRange(c.ChargedAt) {
				continue
			}
			params, _ := json.Marshal(c.Params)
			n++
			units += c.Units
			usd = usd.Add(c.USD)
			fmt.Fprintf(out, "%-8d %-27s %-28s %-28s %-9s %-38s %-14s %-6t %7d %10s %9d %11s\n",
				e.Position, c.ChargedAt.Format(time.RFC3339Nano), c.ChargeID, c.RequestID, c.Endpoint, truncate(string(params), 38),
				c.Engine+"/"+c.Path, c.Cached, c.Units, c.USD.StringFixed(6), units, usd.StringFixed(6))
		}
	}
	fmt.Fprintf(out, "total: %d charges, %d units, %s USD (net of credits)\n", n, units, usd.StringFixed(6))
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// parseReplay reads replay's --as-of and --account.
func parseReplay(fs *flag.FlagSet, args []string) (action, error) {
	asOf := fs.String("as-of", "", "an RFC 3339 time: show the account as it stood then instead")
	accountID := fs.String("account", "", "with --as-of: the account (acct_...)")
	if _, err := parseArgs(fs, args, 0); err != nil {
		return nil, err
	}
	switch {
	case *asOf == "" && *accountID != "":
		// the whole replay rebuilds every read model: not what a look at one account asks for
		return nil, errors.New("--account goes with --as-of TIME: replay checks every account, --as-of shows one")
	case *asOf == "":
		return onDatabase(replay), nil
	}
	at, err := time.Parse(time.RFC3339Nano, *asOf)
	if err != nil || *accountID == "" {
		return nil, errors.New("--as-of takes an RFC 3339 time (2026-11-20T12:00:00Z) and needs --account")
	}
	return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
		v, err := projections.AsOf(ctx, db.pool, *accountID, at, time.Now())
		if err != nil {
			return err
		}
		printAsOf(out, v)
		return nil
	}), nil
}

// replay rebuilds every projection's read model (accounts, ledger, jobs, disputes) from
// the events, reporting for each table whether the live one was equal to what the
// events give (a differing one is left rebuilt), and recomputes the write-side balances
// (key spend, the key's and the account's spend in the current budget period, daily
// allowance use, closed key balances) from the charges and compares them too
// (ledger.RecomputeBalances), and the budgets and zones the meter enforces with the
// keys' and accounts' events (ledger.RecomputeSettings); those it reports, never changes.
//
// A table that differs while the service was writing (events of its projection appended
// between the live table's reading and the rebuild's end, or its subscriber still
// behind) is reported BUSY, not DIFFERS: the two were read at different points of the
// log, so the difference may be that traffic alone. replay then exits 3; run it with
// the servers stopped to compare.
func replay(ctx context.Context, db *database, out io.Writer) error {
	same, busy := true, false
	for _, p := range allProjections() {
		live, err := projections.LiveSnapshot(ctx, db.pool, p)
		if err != nil {
			return err
		}
		rep, err := projections.Rebuild(ctx, db.pool, p)
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", p.Name(), err)
		}
		n := rep.Applied
		if note := setAsideNote(rep); note != "" {
			fmt.Fprintf(out, "%s%s\n", p.Name(), note)
		}
		after, err := projections.Snapshot(ctx, db.pool, p)
		if err != nil {
			return err
		}
		head, err := eventstore.Head(ctx, db.pool)
		if err != nil {
			return err
		}
		moved, err := projections.Appended(ctx, db.pool, p, live.Head, head)
		if err != nil {
			return err
		}
		for _, t := range p.Tables() {
			before := live.Tables[t]
			switch {
			case reflect.DeepEqual(before, after[t]):
				fmt.Fprintf(out, "equal   %s: %d rows (from %d events)\n", t, len(after[t]), n)
			case moved || live.Behind:
				busy = true
				fmt.Fprintf(out, "BUSY    %s: live had %d rows, the events give %d, read %s\n", t, len(before), len(after[t]), busyWhy(moved, live.Behind))
			default:
				same = false
				fmt.Fprintf(out, "DIFFERS %s: live had %d rows, the events give %d\n", t, len(before), len(after[t]))
			}
		}
	}
	checks, settings, err := ledger.Recompute(ctx, db.pool)
	if err != nil {
		return err
	}
	for i, c := range append(checks, settings...) {
		from := "the charges"
		if i >= len(checks) {
			from = "the keys' and accounts' events"
		}
		if c.Equal() {
			fmt.Fprintf(out, "equal   %s: %d rows recomputed from %s\n", c.Name, len(c.Live), from)
		} else {
			same = false
			fmt.Fprintf(out, "DIFFERS %s: live %v, from the events %v\n", c.Name, c.Live, c.Replayed)
		}
	}
	switch {
	case !same:
		return exitCode(1)
	case busy:
		fmt.Fprintln(out, "replay: the service was writing meanwhile, so the BUSY tables could not be compared; run replay with the servers stopped")
		return exitCode(3)
	}
	fmt.Fprintln(out, "replay: the read models and balances equal what the events say")
	return nil
}

// busyWhy says why a table's comparison could not hold: events of its projection
// appended meanwhile, a lagging subscriber.
func busyWhy(appended, behind bool) string {
	var why []string
	if appended {
		why = append(why, "while the service appended events it is made from")
	}
	if behind {
		why = append(why, "with its subscriber behind the log")
	}
	return strings.Join(why, " and ")
}

// changePlan is the operator's way to move an account between plans while paid
// subscriptions are not enabled.
func parsePlan(fs *flag.FlagSet, args []string) (action, error) {
	accountID := fs.String("account", "", "account id (acct_...)")
	planName := fs.String("plan", "", "free, hobby or pro")
	reason := fs.String("reason", "", "why (kept in the event)")
	if _, err := parseArgs(fs, args, 0); err != nil {
		return nil, err
	}
	plan, ok := domain.ParsePlan(*planName)
	if *accountID == "" || !ok {
		return nil, errors.New("--account and --plan (free, hobby or pro) are required")
	}
	return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
		return changePlan(ctx, db, *accountID, plan, *reason, out)
	}), nil
}

func changePlan(ctx context.Context, db *database, accountID string, plan domain.Plan, reason string, out io.Writer) error {
	h := commands.New(eventstore.NewStore(db.pool, nil), nil)
	if err := h.ChangePlan(ctx, accountID, plan, reason); err != nil {
		return err
	}
	fmt.Fprintf(out, "account %s is now on the %s plan\n", accountID, plan)
	return nil
}

// parseRefund reads `chessd refund --reason TEXT [--by NAME] CHARGE_ID...`.
func parseRefund(fs *flag.FlagSet, args []string) (action, error) {
	reason := fs.String("reason", "", "why (kept with the credit, shown to the customer)")
	by := fs.String("by", "", "who decides (default: the operator's $USER)")
	ids, err := parseArgs(fs, args, -1)
	if err != nil {
		return nil, err
	}
	if *reason == "" || len(ids) == 0 {
		return nil, errors.New("--reason and at least one charge id are required")
	}
	return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
		return refund(ctx, db, ids, *reason, decidedBy(*by), out)
	}), nil
}

// refund credits the charges back, all or none.
func refund(ctx context.Context, db *database, ids []string, reason, by string, out io.Writer) error {
	h := commands.New(eventstore.NewStore(db.pool, nil), nil)
	credits, err := h.RefundCharges(ctx, ids, reason, by, "cli-refund")
	if err != nil {
		return err
	}
	for _, c := range credits {
		fmt.Fprintf(out, "credited %s: %d units, %s USD back to key %s (credit %s)\n", c.ChargeID, c.Units, c.USD.StringFixed(6), c.KeyID, c.CreditID)
	}
	return nil
}

// decidedBy names who acts from the command line: --by, else user@host.
func decidedBy(by string) string {
	if by != "" {
		return by
	}
	return operator()
}

// parseDispute reads `chessd dispute list`, `chessd dispute accept ID --note TEXT` and
// `chessd dispute reject ID --reason TEXT`, the flags before or after the id.
func parseDispute(fs *flag.FlagSet, args []string) (action, error) {
	if len(args) == 0 {
		return nil, errors.New("say list, accept or reject")
	}
	sub, args := args[0], args[1:]
	if sub == "list" {
		if _, err := parseArgs(fs, args, 0); err != nil {
			return nil, err
		}
		return onDatabase(listDisputes), nil
	}
	if sub != "accept" && sub != "reject" {
		if isHelp(sub) {
			return nil, flag.ErrHelp
		}
		return nil, fmt.Errorf("unknown dispute command %q: say list, accept or reject", sub)
	}
	accept := sub == "accept"
	var text *string
	if accept {
		text = fs.String("note", "", "what the customer is told (required)")
	} else {
		text = fs.String("reason", "", "why not, told to the customer (required)")
	}
	by := fs.String("by", "", "who decides (default: the operator's $USER)")
	ids, err := parseArgs(fs, args, 1)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("name the dispute: chessd dispute %s ID", sub)
	}
	if strings.TrimSpace(*text) == "" {
		return nil, fmt.Errorf("%s --%s TEXT is required: the customer is shown it", sub, map[bool]string{true: "note", false: "reason"}[accept])
	}
	return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
		h := commands.New(eventstore.NewStore(db.pool, nil), nil)
		if err := h.ResolveDispute(ctx, ids[0], accept, decidedBy(*by), *text, "cli-dispute"); err != nil {
			return err
		}
		_, err := fmt.Fprintf(out, "dispute %s %sed\n", ids[0], sub)
		return err
	}), nil
}

// isHelp says whether arg asks for help, as the flag package reads it.
func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" || arg == "--h" }

func listDisputes(ctx context.Context, db *database, out io.Writer) error {
	rows, err := ledger.OpenDisputes(ctx, db.pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%-28s %-26s %-5s %-27s %s\n", "dispute", "account", "env", "opened_at", "charges / reason")
	for _, d := range rows {
		fmt.Fprintf(out, "%-28s %-26s %-5s %-27s %v / %s\n", d.ID, d.AccountID, d.Env, d.OpenedAt.Format(time.RFC3339), d.ChargeIDs, d.Reason)
	}
	_, err = fmt.Fprintf(out, "%d open\n", len(rows))
	return err
}

// printAsOf prints what the account's /me, keys and usage said at v.At.
func printAsOf(out io.Writer, v *projections.AsOfView) {
	a := v.Account
	fmt.Fprintf(out, "account %s as of %s (%d events)\n", a.ID(), v.At.UTC().Format(time.RFC3339Nano), v.Events)
	fmt.Fprintf(out, "plan %s, email %s, verified %t\n", a.Plan(), a.Email(), a.Verified())
	fmt.Fprintf(out, "%-28s %-16s %-5s %-8s %-14s %s\n", "key", "label", "env", "status", "budget_units", "scopes")
	for _, k := range v.Keys {
		budget := "-"
		if b := k.BudgetUnits(); b != nil {
			budget = fmt.Sprint(*b)
		}
		fmt.Fprintf(out, "%-28s %-16s %-5s %-8s %-14s %v\n", k.ID(), truncate(k.Label(), 16), k.Env(), k.Status(), budget, k.Scopes())
	}
	fmt.Fprintf(out, "%-28s %7s %9s %11s %7s %9s %11s %9s %11s\n", "usage by key", "calls", "units", "usd", "credits", "cr_units", "cr_usd", "net_units", "net_usd")
	// a total per book, as GET /usage answers each env's keys: the live one, then the
	// test one when it has usage
	totals := map[domain.Env]*projections.AsOfUsage{}
	for _, env := range []domain.Env{domain.EnvLive, domain.EnvTest} {
		totals[env] = &projections.AsOfUsage{USD: decimal.Zero, CreditedUSD: decimal.Zero}
	}
	for _, k := range v.Keys {
		u := v.Usage[k.ID()]
		if u == nil {
			continue
		}
		fmt.Fprintf(out, "%-28s %7d %9d %11s %7d %9d %11s %9d %11s\n", k.ID(), u.Calls, u.Units, u.USD.StringFixed(6), u.Credits,
			u.CreditedUnits, u.CreditedUSD.StringFixed(6), u.Units-u.CreditedUnits, u.USD.Sub(u.CreditedUSD).StringFixed(6))
		total := totals[k.Env()]
		total.Calls, total.Units, total.USD = total.Calls+u.Calls, total.Units+u.Units, total.USD.Add(u.USD)
		total.Credits, total.CreditedUnits, total.CreditedUSD = total.Credits+u.Credits, total.CreditedUnits+u.CreditedUnits, total.CreditedUSD.Add(u.CreditedUSD)
	}
	for _, book := range []struct {
		env   domain.Env
		label string
	}{{domain.EnvLive, "total"}, {domain.EnvTest, "total (test book)"}} {
		total := totals[book.env]
		if book.env == domain.EnvTest && total.Calls == 0 && total.Credits == 0 {
			continue
		}
		fmt.Fprintf(out, "%s: %d calls, %d units, %s USD; %d credits, %d units, %s USD; net %d units, %s USD\n", book.label,
			total.Calls, total.Units, total.USD.StringFixed(6), total.Credits, total.CreditedUnits, total.CreditedUSD.StringFixed(6),
			total.Units-total.CreditedUnits, total.USD.Sub(total.CreditedUSD).StringFixed(6))
	}
}
