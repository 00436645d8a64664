package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"chessd/projections"
)

// parseSetAside reads `chessd setaside list [--all]`, `retry ID [--reason TEXT] [--by
// WHO]` and `skip ID --reason TEXT [--by WHO]`, the flags before or after the id.
//
// The set-aside events are those projections could not apply (docs/ARCHITECTURE.md,
// "Events a projection cannot apply"). Every retry and skip is recorded with who did
// it; the event log is never touched.
func parseSetAside(fs *flag.FlagSet, args []string) (action, error) {
	if len(args) == 0 {
		return nil, errors.New("say list, retry ID or skip ID")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list":
		all := fs.Bool("all", false, "also the retried and skipped ones")
		if _, err := parseArgs(fs, args, 0); err != nil {
			return nil, err
		}
		return onDatabase(func(ctx context.Context, db *database, out io.Writer) error { return listSetAside(ctx, db, *all, out) }), nil
	case "retry", "skip":
		reason := fs.String("reason", "", "why (recorded with the action; required to skip)")
		by := fs.String("by", operator(), "who acts (recorded with the action)")
		ids, err := parseArgs(fs, args, 1)
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("name the set-aside event: chessd setaside %s ID", sub)
		}
		id, err := strconv.ParseInt(ids[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("set-aside event id %q: not a number", ids[0])
		}
		return onDatabase(func(ctx context.Context, db *database, out io.Writer) error {
			return resolveSetAside(ctx, db, sub, id, *by, *reason, out)
		}), nil
	}
	if isHelp(sub) {
		return nil, flag.ErrHelp
	}
	return nil, fmt.Errorf("unknown setaside command %q: say list, retry or skip", sub)
}

// resolveSetAside retries or skips (action) the set-aside event id.
func resolveSetAside(ctx context.Context, db *database, action string, id int64, by, reason string, out io.Writer) error {
	act := projections.RetrySetAside
	if action == "skip" {
		act = projections.SkipSetAside
	}
	res, err := act(ctx, db.pool, allProjections(), id, by, reason)
	if err != nil {
		return err
	}
	return reportResolution(out, action, id, res)
}

func listSetAside(ctx context.Context, db *database, all bool, out io.Writer) error {
	list, err := projections.ListSetAside(ctx, db.pool, all)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintln(out, "no set-aside events")
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tPROJECTION\tPOSITION\tSTREAM\tTYPE\tSTATE\tATTEMPTS\tFIRST SEEN\tERROR\tLAST ACTION")
	for _, s := range list {
		last := ""
		if a := s.LastAction; a != nil {
			last = fmt.Sprintf("%s by %s at %s: %s", a.Action, a.Actor, a.At.UTC().Format(time.RFC3339), a.Outcome)
			if a.Reason != "" {
				last += " (" + a.Reason + ")"
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.ID, s.Projection, s.Position, s.StreamID, s.EventType,
			s.State, s.Attempts, s.FirstSeen.UTC().Format(time.RFC3339), oneLine(s.Error), oneLine(last))
	}
	return w.Flush()
}

func reportResolution(out io.Writer, action string, id int64, res projections.Resolution) error {
	if res.FailedAt == res.Position {
		fmt.Fprintf(out, "set-aside event %d (%s, position %d) still cannot be applied (%d held behind it): %s\n",
			id, res.Projection, res.Position, res.StillHeld, oneLine(res.Cause))
		return exitCode(1)
	}
	verb := map[string]string{"retry": "applied", "skip": "skipped"}[action]
	fmt.Fprintf(out, "set-aside event %d (%s, position %d) %s\n", id, res.Projection, res.Position, verb)
	for _, p := range res.Applied {
		if p != res.Position {
			fmt.Fprintf(out, "applied position %d, held behind it\n", p)
		}
	}
	if res.FailedAt != 0 {
		fmt.Fprintf(out, "position %d, held behind it, cannot be applied (%d held behind that one): %s\n",
			res.FailedAt, res.StillHeld, oneLine(res.Cause))
		return exitCode(1)
	}
	return nil
}

// operator names who runs the command: user@host.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if host, err := os.Hostname(); err == nil {
		name += "@" + host
	}
	return name
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// setAsideNote tells what a rebuild left out, for rebuild's and replay's reports.
func setAsideNote(rep projections.RebuildReport) string {
	var parts []string
	if rep.SetAside > 0 {
		parts = append(parts, fmt.Sprintf("%d set aside (chessd setaside list)", rep.SetAside))
	}
	if rep.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped by an operator", rep.Skipped))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; " + strings.Join(parts, ", ")
}
