package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// bundleLimits bound what reading a bundle may take: inflated bytes (the
// sum of its files) and files.
type bundleLimits struct {
	bytes int64
	files int
}

// ErrBundleTooLarge is the error (errors.Is) of a bundle or data file
// refused for a bound of Options (MaxBundleBytes, MaxBundleFiles).
var ErrBundleTooLarge = errors.New("bundle exceeds a configured bound")

// limitKeys names where the bounds are set.
const limitKeys = " (policy.Options.MaxBundleBytes/MaxBundleFiles; shim: [policy] max_bundle_bytes/max_bundle_files; webhook: --max-bundle-bytes/--max-bundle-files)"

func tooLarge(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBundleTooLarge}, args...)...)
}

// readBundle reads the bundle at path (a directory or a .tar.gz), verifying
// its signature against vc unless vc is nil. It returns the bundle and its
// revision: the manifest's revision, or a content digest when it has none.
// A bundle beyond lim is refused before anything of it is kept: OPA's
// tarball loader inflates every file into memory before the signature is
// looked at, and bounds only each file.
func readBundle(path string, vc *bundle.VerificationConfig, lim bundleLimits) (*bundle.Bundle, string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, "", err
	}
	var raw []byte
	if !info.IsDir() {
		// Read once and check what was read: the file may change on disk
		// between a check and a second read.
		if raw, err = readAtMost(path, lim.bytes); err != nil {
			return nil, "", err
		}
	}
	return readBundleFrom(path, raw, vc, lim)
}

// readBundleFrom is readBundle of the tarball raw, read from path, or of
// the directory path when raw is nil.
func readBundleFrom(path string, raw []byte, vc *bundle.VerificationConfig, lim bundleLimits) (*bundle.Bundle, string, error) {
	if raw == nil {
		if err := checkDirectory(path, lim); err != nil {
			return nil, "", err
		}
	} else if err := checkTarball(raw, lim); err != nil {
		return nil, "", err
	}
	var loader bundle.DirectoryLoader
	if raw == nil {
		loader = bundle.NewDirectoryLoader(path)
	} else {
		loader = bundle.NewTarballLoaderWithBaseURL(bytes.NewReader(raw), path)
	}
	reader := bundle.NewCustomReader(loader.WithSizeLimitBytes(lim.bytes)).
		WithCapabilities(Capabilities()).
		WithSizeLimitBytes(lim.bytes).
		WithRegoVersion(ast.RegoV1)
	if vc == nil {
		reader = reader.WithSkipBundleVerification(true)
	} else {
		reader = reader.WithBundleVerificationConfig(vc)
	}
	b, err := reader.Read()
	if err != nil {
		if vc != nil && strings.Contains(err.Error(), "scope mismatch") {
			// OPA checks the scope after the signature itself verified, so
			// the scope the signature carries is authentic: say it.
			found := signedScope(signaturesFile(path, raw))
			return nil, "", fmt.Errorf("%w: this node enforces scope %q, the bundle's signature carries %s (opa build --claims-file with {\"scope\": %q})", err, vc.Scope, found, vc.Scope)
		}
		return nil, "", err
	}
	if vc != nil && b.Signatures.Signatures == nil {
		// Read already refuses this; keep the invariant local and explicit.
		return nil, "", fmt.Errorf("bundle carries no signature")
	}
	if err := checkSignedData(b.Data); err != nil {
		return nil, "", err
	}
	rev := b.Manifest.Revision
	if rev == "" {
		rev = contentRevision(&b)
	}
	return &b, rev, nil
}

// readAtMost reads the file at path, refusing one larger than limit bytes.
func readAtMost(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, tooLarge("%s is larger than MaxBundleBytes (%d bytes)"+limitKeys, filepath.Base(path), limit)
	}
	return raw, nil
}

// checkTarball walks the .tar.gz in raw as a stream, keeping nothing, and
// refuses it when its files' declared sizes add up past lim.bytes or it
// holds more than lim.files files. Sizes are counted before a file's
// content is inflated, so a bomb stops at its first header past the bound.
// A malformed archive passes: OPA's reader then refuses it with its own
// message, having inflated no more than was checked here.
func checkTarball(raw []byte, lim bundleLimits) error {
	gz, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	var total int64
	files := 0
	for {
		h, err := tr.Next()
		if err != nil { // io.EOF, or malformed
			return nil
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if files++; files > lim.files {
			return tooLarge("the archive holds more than MaxBundleFiles (%d) files"+limitKeys, lim.files)
		}
		if total += h.Size; h.Size < 0 || total > lim.bytes {
			return tooLarge("the archive inflates past MaxBundleBytes (%d bytes) at %s"+limitKeys, lim.bytes, h.Name)
		}
	}
}

// checkDirectory refuses a bundle directory whose regular files exceed lim.
func checkDirectory(root string, lim bundleLimits) error {
	var total int64
	files := 0
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if files++; files > lim.files {
			return tooLarge("the directory holds more than MaxBundleFiles (%d) files"+limitKeys, lim.files)
		}
		if total += info.Size(); total > lim.bytes {
			return tooLarge("the directory's files add up past MaxBundleBytes (%d bytes) at %s"+limitKeys, lim.bytes, path)
		}
		return nil
	})
}

// contentRevision is "sha256:<12 hex>" over the bundle's modules and data,
// for bundles whose manifest names no revision.
func contentRevision(b *bundle.Bundle) string {
	h := sha256.New()
	mods := slices.Clone(b.Modules)
	slices.SortFunc(mods, func(x, y bundle.ModuleFile) int { return strings.Compare(x.Path, y.Path) })
	for _, m := range mods {
		fmt.Fprintf(h, "%s\x00%d\x00", m.Path, len(m.Raw))
		h.Write(m.Raw)
	}
	data, _ := json.Marshal(b.Data) // map keys are sorted by encoding/json
	h.Write(data)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))[:12]
}

// mergeData merges the JSON object raw (the data file's content) into
// b.Data. The file may add tenants only, each within its signed tier
// (checkUnsignedTenants): a tenant the bundle defines is refused whole, so
// that no unsigned key sits under a signed tenant.
func mergeData(b *bundle.Bundle, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var extra map[string]any
	if err := dec.Decode(&extra); err != nil {
		return fmt.Errorf("want a JSON object: %w", err)
	}
	if err := onlyTenants(extra); err != nil {
		return err
	}
	bh, _ := extra["bulkhead"].(map[string]any) // onlyTenants checked its type
	if tenants, ok := bh["tenants"]; ok {
		if err := checkUnsignedTenants(b.Data, tenants); err != nil {
			return err
		}
	}
	if b.Data == nil {
		b.Data = map[string]any{}
	}
	return mergeInto(b.Data, extra, "data")
}

// onlyTenants refuses a data file that sets anything but
// data.bulkhead.tenants: it is not signed, so it may say who the tenants
// are but never change what a tier allows, how a rule is enforced or
// which runtime a handler gets.
func onlyTenants(doc map[string]any) error {
	for k, v := range doc {
		if k != "bulkhead" {
			return fmt.Errorf("key %q: only bulkhead.tenants may come from outside the signed bundle", k)
		}
		inner, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("key \"bulkhead\": want an object holding only \"tenants\"")
		}
		for k := range inner {
			if k != "tenants" {
				return fmt.Errorf("key \"bulkhead.%s\": only bulkhead.tenants may come from outside the signed bundle", k)
			}
		}
	}
	return nil
}

func mergeInto(dst, src map[string]any, at string) error {
	for k, v := range src {
		where := at + "." + k
		old, exists := dst[k]
		if !exists {
			dst[k] = v
			continue
		}
		oldObj, ok1 := old.(map[string]any)
		newObj, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("%s is already set by the bundle", where)
		}
		if err := mergeInto(oldObj, newObj, where); err != nil {
			return err
		}
	}
	return nil
}

// VerifyBundle checks the signature of the bundle at path (a directory or a
// .tar.gz) against key, the PEM public key or a file holding it, registered
// under keyID, for scope (empty: the signature must carry no scope). It
// returns the bundle's revision. Unsigned, tampered and wrongly scoped
// bundles are refused with the reason.
func VerifyBundle(path, key, keyID, scope string) (string, error) {
	if keyID == "" {
		return "", fmt.Errorf("policy: key id is required")
	}
	opts := Options{Keys: map[string]string{keyID: key}, KeyID: keyID, Scope: scope}
	vc, err := opts.verificationConfig()
	if err != nil {
		return "", err
	}
	_, rev, err := readBundle(path, vc, opts.bundleLimits())
	if err != nil {
		return "", fmt.Errorf("policy: bundle %s refused: %w", path, err)
	}
	return rev, nil
}

// signaturesFile reads the bundle's .signatures.json: from the directory
// path, or from the tarball raw when it is not nil. Nil when there is none.
func signaturesFile(path string, raw []byte) []byte {
	if raw == nil {
		b, _ := os.ReadFile(filepath.Join(path, ".signatures.json"))
		return b
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil
		}
		if strings.TrimPrefix(h.Name, "/") == ".signatures.json" {
			b, _ := io.ReadAll(io.LimitReader(tr, 1<<20))
			return b
		}
	}
}

// signedScope is the scope claim of the first signature in a
// .signatures.json, quoted, or says there is none. It reads the claim
// without checking the signature: call it only for a signature already
// verified.
func signedScope(file []byte) string {
	var sigs bundle.SignaturesConfig
	if json.Unmarshal(file, &sigs) != nil || len(sigs.Signatures) == 0 {
		return "no signature"
	}
	parts := strings.Split(sigs.Signatures[0], ".")
	if len(parts) != 3 {
		return "an unreadable signature"
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "an unreadable signature"
	}
	var claims struct {
		Scope string `json:"scope"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return "an unreadable signature"
	}
	if claims.Scope == "" {
		return "no scope"
	}
	return strconv.Quote(claims.Scope)
}
