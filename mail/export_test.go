package mail

import (
	"context"
	"crypto/x509"
	"time"
)

// SetRoots makes TLSVerify trust roots instead of the system's certificates.
func SetRoots(s *Sender, roots *x509.CertPool) { s.roots = roots }

// Pass is one pass of Run's: the next due message sent, or, when none is, older
// servers' mail taken over and sent bodies cleared first.
func Pass(ctx context.Context, s *Sender) int { return s.pass(ctx) }

// SetExpireBatch makes Expire work in batches of n rows until the test ends.
func SetExpireBatch(t interface{ Cleanup(func()) }, n int) {
	old := expireBatch
	expireBatch = n
	t.Cleanup(func() { expireBatch = old })
}

// ExpireStatements are Expire's statements for age, each with its arguments, the
// batch's size first.
func ExpireStatements(age time.Duration) (stmts []string, args [][]any) {
	for _, e := range expiries(age) {
		stmts = append(stmts, e.sql)
		args = append(args, append([]any{expireBatch}, e.args...))
	}
	return stmts, args
}
