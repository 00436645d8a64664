package mail

import "crypto/x509"

// SetRoots makes TLSVerify trust roots instead of the system's certificates.
func SetRoots(s *Sender, roots *x509.CertPool) { s.roots = roots }
