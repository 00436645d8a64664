// Package cli is the client side of the chessd binary: `chessd eval`, `bestmove`,
// `analyze`, `jobs watch`, `usage` and `uci` talk to a chessd server through the
// generated client (package client). docs/API.md, "Clients", documents them.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"chessd/client"
	"chessd/ucibridge"
)

// Commands are the subcommands this package runs.
var Commands = map[string]bool{"eval": true, "bestmove": true, "analyze": true, "jobs": true, "usage": true, "uci": true}

// flagsOnly are the commands that take no positional argument: one given is a mistake
// (a flag after it is not read as one), refused rather than ignored.
var flagsOnly = map[string]bool{"analyze": true, "usage": true, "uci": true}

// Usage lists them, for the binary's help.
const Usage = `  eval      [--depth N] [--multipv N] [--movetime MS] [--engine ID] [--wdl] [--json] FEN: evaluate a position on a server
  bestmove  the same flags: the best move
  analyze   [--pgn FILE|-] [--fen FEN] [--depth N] [--multipv N] [--json]: analyse a game (a job) and show each ply
  jobs      watch [--json] JOB_ID: follow a job to its end
  usage     [--from DAY] [--to DAY] [--group-by day,endpoint,...] [--tz ZONE] [--env live|test] [--json]: what was charged, as a table
  uci       speak UCI on stdin/stdout, each search run by the server (for chess GUIs)
            (all: --server URL --key KEY, or CHESSD_SERVER, CHESSD_KEY, or the file $CHESSD_CONFIG / ~/.config/chessd/client.json)`

// IO is where a command reads and writes.
type IO struct {
	In          io.Reader
	Out, Err    io.Writer
	Getenv      func(string) string
	ErrTerminal bool // Err is a terminal: progress rewrites one line
}

// StdIO is the process's own streams.
func StdIO() IO {
	return IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Getenv: os.Getenv, ErrTerminal: isTerminal(os.Stderr)}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Run runs one client command (args[0] names it).
func Run(ctx context.Context, args []string, io IO) error {
	if len(args) == 0 || !Commands[args[0]] {
		return errors.New("not a client command")
	}
	name, args := args[0], args[1:]
	if name == "jobs" {
		if len(args) == 0 || args[0] != "watch" {
			return errors.New("usage: chessd jobs watch [--json] JOB_ID")
		}
		name, args = "jobs watch", args[1:]
	}
	fs := flag.NewFlagSet("chessd "+name, flag.ContinueOnError)
	fs.SetOutput(io.Err)
	conn := connFlags(fs)
	var run func(context.Context, *env) error
	switch name {
	case "eval", "bestmove":
		run = searchCommand(fs, name)
	case "analyze":
		run = analyzeCommand(fs)
	case "jobs watch":
		run = watchCommand(fs)
	case "usage":
		run = usageCommand(fs)
	case "uci":
		run = func(ctx context.Context, e *env) error {
			return ucibridge.New(ucibridge.Config{Server: e.server, Key: e.key}).Run(ctx, e.io.In, e.io.Out)
		}
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flagsOnly[name] && fs.NArg() > 0 {
		return fmt.Errorf("chessd %s takes no arguments, got %q (flags go before any argument)", name, fs.Arg(0))
	}
	server, key, err := conn.resolve(io.Getenv)
	if err != nil {
		return err
	}
	api, err := newAPI(server, key)
	if err != nil {
		return fmt.Errorf("server %q: %w", server, err)
	}
	return run(ctx, &env{io: io, api: api, server: server, key: key, args: fs.Args()})
}

// newAPI is the generated client for server and key, on the client package's
// HTTPClient, whose probes notice a dead server or network (the default's take minutes).
func newAPI(server, key string) (*client.ClientWithResponses, error) {
	return client.NewClientWithResponses(server, client.WithKey(key), client.WithHTTPClient(client.HTTPClient()))
}

// env is what a command runs with.
type env struct {
	io     IO
	api    *client.ClientWithResponses
	server string
	key    string
	args   []string
}

// printJSON writes a raw API answer for scripts: exactly the body the server sent.
func (e *env) printJSON(body []byte) error {
	_, err := fmt.Fprintln(e.io.Out, strings.TrimSpace(string(body)))
	return err
}
