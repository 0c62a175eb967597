package admission

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// CertReloader serves the webhook's TLS certificate and picks up a new one
// without a restart. From files (NewCertReloader), every handshake compares
// the files' identity (size, modification time) with the pair it holds and
// reloads when they change. Kubernetes updates a mounted Secret by swapping
// a symlink, so the certificate and key change together; a half-written
// pair fails to load and the previous certificate keeps being served.
// Without files (a Rotator's Certs), the pair is the one the rotator set
// last, in memory.
type CertReloader struct {
	certFile, keyFile string
	logger            *slog.Logger

	// mu guards cert, notAfter and stamp: the pair being served, when its
	// certificate expires and the file identity it was loaded from.
	mu       sync.RWMutex
	cert     *tls.Certificate
	notAfter time.Time
	stamp    fileStamp
}

// fileStamp identifies the versions of the two files: a replaced file has a
// new inode, a rewritten one a new size or modification time.
type fileStamp struct {
	certIno, keyIno   uint64
	certSize, keySize int64
	certMod, keyMod   int64 // UnixNano
}

func stampOf(fi os.FileInfo) (ino uint64, size, mod int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return ino, fi.Size(), fi.ModTime().UnixNano()
}

// NewCertReloader loads certFile and keyFile (PEM) and fails if they do not
// form a valid pair. logger may be nil.
func NewCertReloader(certFile, keyFile string, logger *slog.Logger) (*CertReloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: certificate and key file are both required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile, logger: logger}
	st, err := r.statFiles()
	if err != nil {
		return nil, err
	}
	if err := r.load(st); err != nil {
		return nil, err
	}
	return r, nil
}

// newMemoryCerts is a CertReloader without files: it serves what set gave
// it, and nothing (a failed handshake) before the first set.
func newMemoryCerts(logger *slog.Logger) *CertReloader {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &CertReloader{logger: logger}
}

// set serves pair from the next handshake on; pair.Leaf must be parsed.
func (r *CertReloader) set(pair *tls.Certificate) {
	r.mu.Lock()
	r.cert, r.notAfter = pair, pair.Leaf.NotAfter
	r.mu.Unlock()
}

// served is the leaf being served, nil before the first pair.
func (r *CertReloader) served() *x509.Certificate {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.cert == nil {
		return nil
	}
	return r.cert.Leaf
}

func (r *CertReloader) statFiles() (fileStamp, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("tls certificate: %w", err)
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("tls key: %w", err)
	}
	var st fileStamp
	st.certIno, st.certSize, st.certMod = stampOf(c)
	st.keyIno, st.keySize, st.keyMod = stampOf(k)
	return st, nil
}

func (r *CertReloader) load(st fileStamp) error {
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tls: loading %s and %s: %w", r.certFile, r.keyFile, err)
	}
	if pair.Leaf == nil {
		return fmt.Errorf("tls: %s: the certificate does not parse", r.certFile)
	}
	r.mu.Lock()
	r.cert, r.notAfter, r.stamp = &pair, pair.Leaf.NotAfter, st
	r.mu.Unlock()
	return nil
}

// NotAfter is when the certificate being served expires: the notAfter of
// the leaf, the first certificate of the file.
func (r *CertReloader) NotAfter() time.Time {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.notAfter
}

// Reload reloads the pair if its files changed. On failure the previous
// pair stays in service and the error is returned. Without files it does
// nothing.
func (r *CertReloader) Reload() error {
	if r.certFile == "" {
		return nil
	}
	st, err := r.statFiles()
	if err != nil {
		return err
	}
	r.mu.RLock()
	same := st == r.stamp
	r.mu.RUnlock()
	if same {
		return nil
	}
	if err := r.load(st); err != nil {
		return err
	}
	r.logger.Info("tls certificate reloaded", "cert", r.certFile)
	return nil
}

// GetCertificate is a tls.Config.GetCertificate callback.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if err := r.Reload(); err != nil {
		r.logger.Warn("tls certificate reload failed; serving the previous one", "err", err)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.cert == nil {
		return nil, errors.New("tls: no serving certificate yet")
	}
	return r.cert, nil
}

// TLSConfig returns a server configuration that serves the reloaded pair.
func (r *CertReloader) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}
