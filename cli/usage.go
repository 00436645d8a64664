package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"chessd/client"
)

// usageCommand is `chessd usage`: GET /usage as a table, one row per group and a total.
func usageCommand(fs *flag.FlagSet) func(context.Context, *env) error {
	from := fs.String("from", "", "first day, YYYY-MM-DD (default: 30 days ago)")
	to := fs.String("to", "", "last day, YYYY-MM-DD (default: today)")
	groupBy := fs.String("group-by", "day", "comma-separated: key, hour, day, month, endpoint, engine, env, cached")
	tz := fs.String("tz", "", "IANA time zone of the days (default UTC)")
	book := fs.String("env", "", "the book to show, live or test (default: the key's own)")
	asJSON := fs.Bool("json", false, "print the API's answer as JSON")
	return func(ctx context.Context, e *env) error {
		params := &client.GetUsageParams{}
		if *book != "" {
			v := client.Env(*book) // the server checks it
			params.Env = &v
		}
		for _, p := range []struct {
			dst **string
			v   string
		}{{&params.From, *from}, {&params.To, *to}, {&params.GroupBy, *groupBy}, {&params.Tz, *tz}} {
			if p.v != "" {
				v := p.v
				*p.dst = &v
			}
		}
		res, err := e.api.GetUsageWithResponse(ctx, params)
		if err != nil {
			return err
		}
		if err := client.Check(res.HTTPResponse, res.Body); err != nil {
			return err
		}
		if *asJSON {
			return e.printJSON(res.Body)
		}
		u := res.JSON200
		// The first column holds the groups' values and the TOTAL label: it is there
		// (with no header) when nothing is grouped, so that each number sits under its own.
		cols := make([]string, max(len(u.GroupBy), 1))
		for i, g := range u.GroupBy {
			cols[i] = strings.ToUpper(string(g))
		}
		w := e.io.Out
		fmt.Fprintf(w, "Usage %s to %s (%s)\n", u.From, u.To, u.Tz)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, strings.Join(append(cols, "CALLS", "UNITS", "USD", "CREDITED", "NET USD"), "\t")+"\t")
		for _, g := range u.Groups {
			keys := make([]string, len(cols))
			for i, by := range u.GroupBy {
				keys[i] = groupValue(string(by), g.Key, g.Hour, g.Day, g.Month, g.Endpoint, g.Engine, g.Env, (*string)(g.Cached))
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t\n", strings.Join(keys, "\t"), g.Calls, g.Units, g.Usd, g.CreditedUsd, g.NetUsd)
		}
		t := u.Totals
		blank := strings.Repeat("\t", len(cols)-1)
		fmt.Fprintf(tw, "TOTAL%s\t%d\t%d\t%s\t%s\t%s\t\n", blank, t.Calls, t.Units, t.Usd, t.CreditedUsd, t.NetUsd)
		if err := tw.Flush(); err != nil {
			return err
		}
		if u.NextCursor != nil {
			fmt.Fprintln(w, "(more groups: narrow the dates, or use --json and the API's cursor)")
		}
		return nil
	}
}

// groupValue is a group's value for the column `by`.
func groupValue(by string, key, hour, day, month, endpoint, engine, env, cached *string) string {
	v := map[string]*string{"key": key, "hour": hour, "day": day, "month": month, "endpoint": endpoint,
		"engine": engine, "env": env, "cached": cached}[by]
	if v == nil {
		return "-"
	}
	return *v
}
