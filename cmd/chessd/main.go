// Command chessd is the chess-engine service.
//
//	chessd [serve]   run the HTTP API under /v1 (default)
//	chessd migrate   apply the database migrations and exit
//	chessd verify    walk the event log's hash chain; exit 1 at the first tampered event
//	chessd rebuild   drop the read models and rebuild them from the events
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
)

func main() {
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

// exitCode ends the program with a status and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func run(ctx context.Context, args []string, getenv func(string) string, stdout *os.File) error {
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
	case "migrate":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return nil })
	case "verify":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return verify(ctx, db, stdout) })
	case "rebuild":
		return withDatabase(ctx, cfg, logger, func(db *database) error { return rebuild(ctx, db, stdout) })
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, "usage: chessd [serve|migrate|verify|rebuild]")
		return nil
	}
	return fmt.Errorf("unknown command %q (serve, migrate, verify, rebuild)", cmd)
}
