// Package procenv gives the environment of the processes chessd starts (engines,
// PostgreSQL's tools and server): chessd's own, less what is chessd's alone. The
// server outlives chessd when another process adopts it, and runs as the shared
// postgres user, whose other processes can read /proc/<pid>/environ: neither it nor an
// engine needs the key pepper, a password or a token.
package procenv

import (
	"os"
	"strings"
)

// private says whether an environment variable is chessd's configuration (all of
// CHESSD_*: the pepper, the SMTP password, the metrics token...) or a database
// credential.
func private(name string) bool {
	return strings.HasPrefix(name, "CHESSD_") || name == "DATABASE_URL" || name == "PGPASSWORD"
}

// Environ is os.Environ without chessd's configuration and credentials.
func Environ() []string { return Filter(os.Environ()) }

// Filter is env (NAME=value entries) without the private ones.
func Filter(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !private(name) {
			out = append(out, kv)
		}
	}
	return out
}
