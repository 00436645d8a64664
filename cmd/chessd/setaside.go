package main

import (
	"context"
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

const setAsideUsage = `usage: chessd setaside list [--all]
       chessd setaside retry ID [--reason TEXT] [--by WHO]
       chessd setaside skip ID --reason TEXT [--by WHO]`

// setAside lists, retries or skips the events projections set aside because they could
// not apply them (docs/ARCHITECTURE.md, "Events a projection cannot apply"). Every
// retry and skip is recorded with who did it; the event log is never touched.
func setAside(ctx context.Context, db *database, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", setAsideUsage)
	}
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("setaside list", flag.ContinueOnError)
		all := fs.Bool("all", false, "also the retried and skipped ones")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return listSetAside(ctx, db, *all, out)
	case "retry", "skip":
		if len(args) < 2 {
			return fmt.Errorf("%s", setAsideUsage)
		}
		id, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil {
			return fmt.Errorf("set-aside event id %q: not a number\n%s", args[1], setAsideUsage)
		}
		fs := flag.NewFlagSet("setaside "+args[0], flag.ContinueOnError)
		reason := fs.String("reason", "", "why (recorded with the action; required to skip)")
		by := fs.String("by", operator(), "who acts (recorded with the action)")
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		act := projections.RetrySetAside
		if args[0] == "skip" {
			act = projections.SkipSetAside
		}
		res, err := act(ctx, db.pool, allProjections(), id, *by, *reason)
		if err != nil {
			return err
		}
		return reportResolution(out, args[0], id, res)
	}
	return fmt.Errorf("unknown setaside command %q\n%s", args[0], setAsideUsage)
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
