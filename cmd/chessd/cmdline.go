package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"chessd/cli"
	"chessd/metrics"
)

// operatorCommand is a subcommand run on the server's side, configured by the
// environment. Its command line is read and checked before anything is opened, so that
// --help or a mistyped flag never starts a database, migrates it or starts engines.
type operatorCommand struct {
	name     string
	synopsis string // what follows the name: flags and arguments
	about    string // what it does; lines after the first are indented in the list
	// parse reads args into fs (whose flags it defines) and returns what to run; it
	// opens nothing. flag.ErrHelp asks for the command's help.
	parse func(fs *flag.FlagSet, args []string) (action, error)
}

// action runs a command whose command line has been read.
type action func(ctx context.Context, cfg config, logger *slog.Logger, out io.Writer) error

// operatorCommands are the server-side commands, in the order chessd's help lists them.
var operatorCommands = []operatorCommand{
	{name: "serve", about: "run the HTTP API under /v1 (the default command)", parse: noArguments(logsOnly(serve))},
	{name: "worker", about: "run only the job executor (several workers may share one database)", parse: noArguments(logsOnly(work))},
	{name: "migrate", about: "apply the database migrations", parse: noArguments(
		onDatabase(func(context.Context, *database, io.Writer) error { return nil }))},
	{name: "verify", synopsis: "[--anchor POS:HASH]... [--anchors FILE]", parse: parseVerify,
		about: "walk the event log's hash chain and check it against anchors printed by an earlier\n" +
			"verify; exit 0 when intact, 1 at the first tampered event, 2 when it could not check\n" +
			"(a bad flag, anchor or anchors file, the database out of reach)"},
	{name: "rebuild", about: "drop the read models and rebuild them from the events", parse: noArguments(onDatabase(rebuild))},
	{name: "replay", synopsis: "[--as-of TIME --account ACCOUNT]", parse: parseReplay,
		about: "rebuild every read model (accounts, ledger, jobs, disputes) from the events, say\n" +
			"which live tables differed (left rebuilt), and check the balances against the charges;\n" +
			"--as-of TIME --account ACCOUNT instead: what the account's /me, keys and usage said at TIME"},
	{name: "audit", synopsis: "--key KEY --from DAY --to DAY", parse: parseAudit,
		about: "every charge of a key with a running total"},
	{name: "plan", synopsis: "--account ACCOUNT --plan free|hobby|pro [--reason TEXT]", parse: parsePlan,
		about: "move an account to another plan"},
	{name: "refund", synopsis: "--reason TEXT [--by NAME] CHARGE_ID...", parse: parseRefund,
		about: "credit charges back (each once, all or none)"},
	{name: "dispute", synopsis: "list | accept ID --note TEXT [--by NAME] | reject ID --reason TEXT [--by NAME]", parse: parseDispute,
		about: "answer customers' disputes"},
	{name: "setaside", synopsis: "list [--all] | retry ID [--reason TEXT] [--by NAME] | skip ID --reason TEXT [--by NAME]", parse: parseSetAside,
		about: "the events a projection could not apply"},
}

// usage is chessd's help: every command.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: chessd [command]  (chessd COMMAND --help: the command's own)\n")
	for _, c := range operatorCommands {
		line := c.about
		if c.synopsis != "" {
			line = c.synopsis + ": " + line
		}
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, strings.ReplaceAll(line, "\n", "\n            "))
	}
	b.WriteString("client commands (talk to a server):\n")
	b.WriteString(cli.Usage)
	return b.String()
}

// help is the command's own help: its synopsis, what it does, and its flags.
func (c *operatorCommand) help(fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s\n%s\n", strings.TrimSpace("chessd "+c.name+" "+c.synopsis), c.about)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		b.WriteString("flags:\n")
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	b.WriteString("configured by the environment (DATABASE_URL, CHESSD_DATA_DIR, …: README.md), not by flags\n")
	return b.String()
}

func findCommand(name string) *operatorCommand {
	for i := range operatorCommands {
		if operatorCommands[i].name == name {
			return &operatorCommands[i]
		}
	}
	return nil
}

// runOperator reads the command line of cmd, then the configuration, then runs it. A
// command line it cannot run is refused with exit status 2, as Go's flag package does,
// and so is a configuration the environment gets wrong; --help prints the command's
// help and exits 0; none of them opens anything.
func runOperator(ctx context.Context, cmd *operatorCommand, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("chessd "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and the help are printed here, not by the flag package
	act, err := cmd.parse(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, err = fmt.Fprint(stdout, cmd.help(fs))
		return err
	case err != nil:
		return exitError{code: 2, err: fmt.Errorf("%s: %w\n%s", cmd.name, err, cmd.help(fs))}
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		// Nothing ran either: exit 2, as for the command line (verify's 1 says tampered).
		return exitError{code: 2, err: err}
	}
	logger := slog.New(metrics.CountLogs(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))
	return act(ctx, cfg, logger, stdout)
}

// parseArgs parses args into fs with the flags anywhere among the positional arguments
// (every argument after "--" is positional), and returns the positional ones, refusing
// more than most (most < 0: any number).
func parseArgs(fs *flag.FlagSet, args []string, most int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:] // fs stopped at a positional argument: the flags after it go on
	}
	switch {
	case most < 0 || len(pos) <= most:
		return pos, nil
	case most == 0:
		return nil, fmt.Errorf("takes no arguments, got %q", pos[0])
	}
	return nil, fmt.Errorf("unexpected argument %q", pos[most])
}

// noArguments is the parser of a command that takes no flags and no arguments.
func noArguments(act action) func(*flag.FlagSet, []string) (action, error) {
	return func(fs *flag.FlagSet, args []string) (action, error) {
		if _, err := parseArgs(fs, args, 0); err != nil {
			return nil, err
		}
		return act, nil
	}
}

// logsOnly is the action of serve and work, which write nothing but their logs.
func logsOnly(fn func(context.Context, config, *slog.Logger) error) action {
	return func(ctx context.Context, cfg config, logger *slog.Logger, _ io.Writer) error {
		return fn(ctx, cfg, logger)
	}
}

// onDatabase is the action that runs fn on the opened, migrated database.
func onDatabase(fn func(context.Context, *database, io.Writer) error) action {
	return func(ctx context.Context, cfg config, logger *slog.Logger, out io.Writer) error {
		return withDatabase(ctx, cfg, logger, func(db *database) error { return fn(ctx, db, out) })
	}
}

// exitCode ends the program with a status and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// exitError ends the program with a status other than 1, printing err.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// exitStatus is the process's exit status for run's outcome, and what to print on
// stderr ("" for nothing).
func exitStatus(err error) (int, string) {
	var silent exitCode
	var coded exitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &silent):
		return int(silent), ""
	case errors.As(err, &coded):
		return coded.code, coded.Error()
	}
	return 1, err.Error()
}
