// Package migrations holds the numbered SQL steps of the schema, embedded in the binary.
// Each file is applied once, in name order, in its own transaction (see postgres.Migrate).
// Files are never edited once released: a change is a new file.
package migrations

import "embed"

//go:embed *.sql
var FS embed.FS
