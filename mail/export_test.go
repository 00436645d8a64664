package mail

import (
	"context"
	"crypto/x509"
)

// SetRoots makes TLSVerify trust roots instead of the system's certificates.
func SetRoots(s *Sender, roots *x509.CertPool) { s.roots = roots }

// Pass is one pass of Run's: the next due message sent, or, when none is, older
// servers' mail taken over and sent bodies cleared first.
func Pass(ctx context.Context, s *Sender) int { return s.pass(ctx) }
