// Command chessd is the chess-engine service.
//
//	chessd [serve]   run the HTTP API under /v1 (default)
//	chessd worker    run only the job executor
//	chessd migrate   apply the database migrations and exit
//	chessd verify    walk the event log's hash chain (and check it against anchors kept
//	                 outside the database); exit 1 at the first tampered event, 2 when
//	                 it could not check
//	chessd rebuild   drop the read models and rebuild them from the events
//	chessd replay    rebuild every read model, say where the live ones differed, and check
//	                 the balances against the charges
//	chessd audit     every charge of a key in a date range, with a running total
//	chessd plan      move an account to another plan (operators)
//	chessd refund    credit charges back, with a reason (operators)
//	chessd dispute   list open disputes, accept or reject one (operators)
//	chessd setaside  list, retry or skip the events a projection could not apply
//	chessd eval, bestmove, analyze, jobs watch, usage, uci   client commands (package cli)
//
// main only wires: configuration from the environment, a context cancelled by
// SIGINT/SIGTERM, and the subcommand. Each server-side command reads its command line
// (cmdline.go) before its configuration and before it opens anything: `chessd COMMAND
// --help` prints its usage and exits 0; a flag it does not have or an argument too many
// is refused with exit status 2.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"chessd/cli"
	"chessd/gctune"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	code, msg := exitStatus(err)
	if msg != "" {
		fmt.Fprintln(os.Stderr, "chessd:", msg)
	}
	os.Exit(code)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout *os.File) error {
	if len(args) > 0 && cli.Commands[args[0]] { // client commands: no server configuration
		streams := cli.StdIO()
		streams.Out, streams.Getenv = stdout, getenv
		return cli.Run(ctx, args, streams)
	}
	name := "serve"
	if len(args) > 0 {
		name, args = args[0], args[1:]
	}
	switch name {
	case "help", "-h", "-help", "--help":
		_, err := fmt.Fprint(stdout, usage())
		return err
	}
	cmd := findCommand(name)
	if cmd == nil {
		return exitError{code: 2, err: fmt.Errorf("unknown command %q\n%s", name, usage())}
	}
	return runOperator(ctx, cmd, args, getenv, stdout)
}
