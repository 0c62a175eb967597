package admission

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
)

// ClientAuth authenticates the webhook's callers by their TLS client
// certificate. The API server presents one when its AdmissionConfiguration
// names a kubeconfig for the webhook's Service (docs/install.md); nothing
// else in the cluster has a certificate the CA signed, so nothing else can
// have a request reviewed, however it reaches the port.
type ClientAuth struct {
	// CAs verify the client's certificate chain; required.
	CAs *x509.CertPool
	// Names, when not empty, are the identities a verified client
	// certificate must carry, as its subject common name or a DNS name.
	// Use them when CAs also sign certificates for other clients (a
	// cluster's client CA signs every kubelet's).
	Names []string
}

// LoadClientAuth reads the PEM certificates of caFile as the client CAs.
func LoadClientAuth(caFile string, names []string) (*ClientAuth, error) {
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("admission: client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("admission: client CA %s: no PEM certificate in it", caFile)
	}
	return &ClientAuth{CAs: pool, Names: slices.Clone(names)}, nil
}

// errClientName is returned by the handshake when a verified client
// certificate names none of ClientAuth.Names.
var errClientName = errors.New("client certificate names no allowed identity")

// apply makes cfg require and verify a client certificate. A nil
// ClientAuth leaves cfg as it is.
func (a *ClientAuth) apply(cfg *tls.Config) {
	if a == nil {
		return
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.ClientCAs = a.CAs
	if len(a.Names) == 0 {
		return
	}
	names := slices.Clone(a.Names)
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errClientName
		}
		leaf := cs.PeerCertificates[0]
		if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
			return nil
		}
		return fmt.Errorf("%w: subject %q, DNS names %v; allowed: %v", errClientName, leaf.Subject.CommonName, leaf.DNSNames, names)
	}
}
