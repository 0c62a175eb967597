package policy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
)

// Options configure an Engine. Open validates them and names the first bad
// field in its error.
type Options struct {
	// BundlePath is the policy bundle: a directory or a .tar.gz built by
	// `opa build`. Required.
	BundlePath string

	// Keys maps a key id to the public key that may sign bundles: either the
	// PEM text itself or the path of a PEM file. RSA keys verify RS256, ECDSA
	// keys ES256/ES384/ES512 by curve; KeyAlgorithm overrides that. Required
	// unless InsecureSkipVerification is set.
	Keys map[string]string

	// KeyID names the entry of Keys that must have signed the bundle. Required
	// with Keys: a bundle whose signature names another key is refused (and
	// OPA before v1.21.3 skipped verification without one, GHSA-g2pf-6v5v-qcc8).
	KeyID string

	// KeyAlgorithm is the JWS algorithm of KeyID's key, such as "RS256" or
	// "PS256". Empty: derived from the key type.
	KeyAlgorithm string

	// Scope is the scope the bundle's signature must carry (`opa build
	// --scope`). Required with Keys: a bundle signed for another scope, such
	// as another cluster or environment, is refused.
	Scope string

	// InsecureSkipVerification loads bundles without checking any signature.
	// For development only: Open logs an error-level warning on every load.
	InsecureSkipVerification bool

	// DataPath is an optional JSON file merged into the bundle's data, for
	// example data.bulkhead.tenants kept by the cluster operator. It must not
	// redefine a value the bundle sets. It is not signed: keep it where only
	// root can write.
	DataPath string

	// DecisionLog receives one JSON line per decision. Nil: no writer.
	DecisionLog io.Writer

	// DecisionLogFile is a file that receives one JSON line per decision,
	// rotated by size; "-" means standard output. Ignored when DecisionLog is set.
	DecisionLogFile string

	// DecisionLogMaxBytes is the size at which DecisionLogFile rotates.
	// 0 means 64 MiB.
	DecisionLogMaxBytes int64

	// DecisionLogBackups is how many rotated files are kept (file.1 is the
	// newest). 0 means 5.
	DecisionLogBackups int

	// MaxBundleBytes bounds the bundle once inflated: the sum of its files'
	// sizes (a .tar.gz's as its headers declare them, read as a stream and
	// never held), and the size of DataPath. A larger bundle is refused
	// before its signature is verified or any file of it is kept. 0 means
	// DefaultMaxBundleBytes.
	MaxBundleBytes int64

	// MaxBundleFiles bounds the number of files in the bundle, refused as
	// MaxBundleBytes is. 0 means DefaultMaxBundleFiles.
	MaxBundleFiles int

	// Evaluator is how decisions are computed: EvaluatorPlan (the default
	// when empty) runs OPA's compiled plan of the decision query and falls
	// back to OPA's interpreter when a bundle needs it; EvaluatorTopdown
	// always uses the interpreter. Both give the same decisions; the plan is
	// several times faster.
	Evaluator string

	// PlanCacheDir is a directory where the engine keeps the compiled plan
	// of a verified tarball bundle, keyed by a digest of the bundle's and
	// the data file's bytes, the verification config and this binary, so
	// that opening the same bundle again skips parsing, compiling and
	// planning it (plancache.go). It must be an absolute path; it is created
	// 0700, and neither it nor an entry is read unless it belongs to this
	// process's user and is closed to everyone else. Entries are
	// authenticated with PlanCacheKeyFile. Empty: no cache.
	PlanCacheDir string

	// PlanCacheKeyFile is the node's secret that authenticates plan cache
	// entries (HMAC-SHA256): a writer of PlanCacheDir who cannot read it
	// cannot make an entry the engine serves. It must be an absolute path
	// outside PlanCacheDir. When the file does not exist the engine creates
	// it (32 random bytes, 0600, its directory 0700); it is used only when
	// it belongs to this process's user and is closed to everyone else, and
	// its directory may be written by no one else. Empty, or a key that
	// cannot be used: the cache is neither read nor written (logged).
	PlanCacheKeyFile string

	// Logger receives the engine's own messages (loads, reloads, failures).
	// Nil means slog.Default().
	Logger *slog.Logger
}

func (o *Options) validate() error {
	if o.BundlePath == "" {
		return errors.New("policy: Options.BundlePath is required")
	}
	if !KnownEvaluator(o.Evaluator) {
		return fmt.Errorf("policy: Options.Evaluator %q must be %q or %q", o.Evaluator, EvaluatorPlan, EvaluatorTopdown)
	}
	if _, err := os.Stat(o.BundlePath); err != nil {
		return fmt.Errorf("policy: Options.BundlePath: %w", err)
	}
	if o.InsecureSkipVerification {
		if len(o.Keys) > 0 || o.KeyID != "" {
			return errors.New("policy: Options.InsecureSkipVerification is set together with Keys/KeyID; choose one")
		}
	} else {
		if len(o.Keys) == 0 {
			return errors.New("policy: Options.Keys is required (bundles are verified by default; InsecureSkipVerification opts out for development)")
		}
		if o.KeyID == "" {
			return errors.New("policy: Options.KeyID is required with Keys: the bundle must be signed by a named key")
		}
		if _, ok := o.Keys[o.KeyID]; !ok {
			return fmt.Errorf("policy: Options.KeyID %q is not a key of Options.Keys", o.KeyID)
		}
		if o.Scope == "" {
			return errors.New("policy: Options.Scope is required with Keys: the signature must carry the scope this node enforces")
		}
		if o.KeyAlgorithm != "" && !keys.IsSupportedAlgorithm(o.KeyAlgorithm) {
			return fmt.Errorf("policy: Options.KeyAlgorithm %q is not a supported JWS algorithm", o.KeyAlgorithm)
		}
	}
	if o.DataPath != "" {
		if _, err := os.Stat(o.DataPath); err != nil {
			return fmt.Errorf("policy: Options.DataPath: %w", err)
		}
	}
	if o.PlanCacheDir != "" && !filepath.IsAbs(o.PlanCacheDir) {
		return fmt.Errorf("policy: Options.PlanCacheDir %q must be an absolute path", o.PlanCacheDir)
	}
	if o.PlanCacheKeyFile != "" {
		if !filepath.IsAbs(o.PlanCacheKeyFile) {
			return fmt.Errorf("policy: Options.PlanCacheKeyFile %q must be an absolute path", o.PlanCacheKeyFile)
		}
		if o.PlanCacheDir != "" && insideDir(filepath.Clean(o.PlanCacheKeyFile), filepath.Clean(o.PlanCacheDir)) {
			return fmt.Errorf("policy: Options.PlanCacheKeyFile %q lies inside Options.PlanCacheDir %q: a writer of the cache could read or replace the key that authenticates it", o.PlanCacheKeyFile, o.PlanCacheDir)
		}
	}
	if o.MaxBundleBytes < 0 {
		return fmt.Errorf("policy: Options.MaxBundleBytes %d must not be negative", o.MaxBundleBytes)
	}
	if o.MaxBundleFiles < 0 {
		return fmt.Errorf("policy: Options.MaxBundleFiles %d must not be negative", o.MaxBundleFiles)
	}
	if o.DecisionLogMaxBytes < 0 {
		return fmt.Errorf("policy: Options.DecisionLogMaxBytes %d must not be negative", o.DecisionLogMaxBytes)
	}
	if o.DecisionLogBackups < 0 {
		return fmt.Errorf("policy: Options.DecisionLogBackups %d must not be negative", o.DecisionLogBackups)
	}
	return nil
}

// Defaults of the bundle bounds (Options.MaxBundleBytes, MaxBundleFiles):
// far above a policy bundle with the tenants of a large cluster, far below
// what the webhook's 512 MiB may hold once the bundle is parsed.
const (
	DefaultMaxBundleBytes = 32 << 20
	DefaultMaxBundleFiles = 4096
)

// bundleLimits are Options.MaxBundleBytes and MaxBundleFiles with their
// defaults applied.
func (o *Options) bundleLimits() bundleLimits {
	l := bundleLimits{bytes: o.MaxBundleBytes, files: o.MaxBundleFiles}
	if l.bytes == 0 {
		l.bytes = DefaultMaxBundleBytes
	}
	if l.files == 0 {
		l.files = DefaultMaxBundleFiles
	}
	return l
}

// verificationConfig turns Keys, KeyID and Scope into OPA's verification
// config; nil when verification is skipped.
func (o *Options) verificationConfig() (*bundle.VerificationConfig, error) {
	if o.InsecureSkipVerification {
		return nil, nil
	}
	configs := make(map[string]*keys.Config, len(o.Keys))
	for id, key := range o.Keys {
		pemText, err := readKey(key)
		if err != nil {
			return nil, fmt.Errorf("policy: Options.Keys[%q]: %w", id, err)
		}
		alg := o.KeyAlgorithm
		if alg == "" || id != o.KeyID {
			alg, err = algorithmOf(pemText)
			if err != nil {
				return nil, fmt.Errorf("policy: Options.Keys[%q]: %w", id, err)
			}
		}
		configs[id] = &keys.Config{Key: pemText, Algorithm: alg, Scope: o.Scope}
	}
	return bundle.NewVerificationConfig(configs, o.KeyID, o.Scope, nil), nil
}

// readKey returns key itself when it is PEM text, else the content of the
// file it names.
func readKey(key string) (string, error) {
	if strings.Contains(key, "-----BEGIN ") {
		return key, nil
	}
	b, err := os.ReadFile(key)
	if err != nil {
		return "", fmt.Errorf("neither PEM text nor a readable file: %w", err)
	}
	return string(b), nil
}

// algorithmOf derives the JWS algorithm from a PEM public key.
func algorithmOf(pemText string) (string, error) {
	block, _ := pem.Decode([]byte(pemText))
	if block == nil {
		return "", errors.New("no PEM block")
	}
	var pub any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		cert, err = x509.ParseCertificate(block.Bytes)
		if err == nil {
			pub = cert.PublicKey
		}
	default:
		return "", fmt.Errorf("PEM block %q is not a public key or certificate", block.Type)
	}
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", block.Type, err)
	}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return "RS256", nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ES256", nil
		case elliptic.P384():
			return "ES384", nil
		case elliptic.P521():
			return "ES512", nil
		}
		return "", fmt.Errorf("ECDSA curve %s is not supported", k.Curve.Params().Name)
	default:
		return "", fmt.Errorf("key type %T is not supported (RSA or ECDSA)", pub)
	}
}
