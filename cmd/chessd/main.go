// Command chessd is the chess-engine service.
//
//	chessd [serve]   run the HTTP API under /v1 (default)
//	chessd worker    run only the job executor
//	chessd migrate   apply the database migrations and exit
//	chessd verify    walk the event log's hash chain (and check it against anchors kept
//	                 outside the database); exit 1 at the first tampered event
//	chessd rebuild   drop the read models and rebuild them from the events
//	chessd replay    rebuild the ledger read models and check they equal the live ones
//	chessd audit     every charge of a key in a date range, with a running total
//	chessd plan      move an account to another plan (operators)
//	chessd refund    credit charges back, with a reason (operators)
//	chessd dispute   list open disputes, accept or reject one (operators)
//	chessd setaside  list, retry or skip the events a projection could not apply
//	chessd eval, bestmove, analyze, jobs watch, usage, uci   client commands (package cli)
//
// main only wires: configuration from the environment, a context cancelled by
// SIGINT/SIGTERM, and the subcommand.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	var exit exitCode
	switch {
	case errors.As(err, &exit):
		os.Exit(int(exit))
	case err != nil:
		fmt.Fprintln(os.Stderr, "chessd:", err)
		os.Exit(1)
	}
}

const usage = `usage: chessd [command]
  serve     run the HTTP API under /v1 (default)
  worker    run only the job executor (several workers may share one database)
  migrate   apply the database migrations
  verify    [--anchor POS:HASH]... [--anchors FILE]: walk the event log's hash chain and check
            it against anchors printed by an earlier verify; exit 1 at the first tampered event
  rebuild   drop the read models and rebuild them from the events
  replay    rebuild the ledger read models from the events and check they equal the live ones;
            --as-of TIME --account ACCOUNT: what the account's /me, keys and usage said at TIME
  audit     --key KEY --from DAY --to DAY: every charge of a key with a running total
  plan      --account ACCOUNT --plan free|hobby|pro: move an account to another plan
  refund    --reason TEXT [--by NAME] CHARGE_ID...: credit charges back (each once, all or none)
  dispute   list | accept ID --note TEXT [--by NAME] | reject ID --reason TEXT [--by NAME]: answer customers' disputes
  setaside  list [--all] | retry ID [--reason TEXT] | skip ID --reason TEXT: the events a projection could not apply
client commands (talk to a server):
` + cli.Usage

// exitCode ends the program with a status and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func run(ctx context.Context, args []string, getenv func(string) string, stdout *os.File) error {
	if len(args) > 0 && cli.Commands[args[0]] { // client commands: no server configuration
		streams := cli.StdIO()
		streams.Out, streams.Getenv = stdout, getenv
		return cli.Run(ctx, args, streams)
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "serve":
		return serve(ctx, cfg, logger)
	case "worker":
		return work(ctx, cfg, logger)
	case "migrate":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return nil })
	case "verify":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return verify(ctx, db, args[1:], stdout) })
	case "rebuild":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return rebuild(ctx, db, stdout) })
	case "replay":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return replay(ctx, db, args[1:], stdout) })
	case "audit":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return audit(ctx, db, args[1:], stdout) })
	case "plan":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return changePlan(ctx, db, args[1:], stdout) })
	case "refund":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return refund(ctx, db, args[1:], stdout) })
	case "dispute":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return dispute(ctx, db, args[1:], stdout) })
	case "setaside":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return setAside(ctx, db, args[1:], stdout) })
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}
