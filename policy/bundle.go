package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// maxBundleBytes bounds every file read from a bundle.
const maxBundleBytes = 64 << 20

// readBundle reads the bundle at path (a directory or a .tar.gz), verifying
// its signature against vc unless vc is nil. It returns the bundle and its
// revision: the manifest's revision, or a content digest when it has none.
func readBundle(path string, vc *bundle.VerificationConfig) (*bundle.Bundle, string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, "", err
	}
	var loader bundle.DirectoryLoader
	if info.IsDir() {
		loader = bundle.NewDirectoryLoader(path)
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, "", err
		}
		defer f.Close()
		loader = bundle.NewTarballLoaderWithBaseURL(f, path)
	}
	reader := bundle.NewCustomReader(loader.WithSizeLimitBytes(maxBundleBytes)).
		WithCapabilities(Capabilities()).
		WithSizeLimitBytes(maxBundleBytes).
		WithRegoVersion(ast.RegoV1)
	if vc == nil {
		reader = reader.WithSkipBundleVerification(true)
	} else {
		reader = reader.WithBundleVerificationConfig(vc)
	}
	b, err := reader.Read()
	if err != nil {
		return nil, "", err
	}
	if vc != nil && b.Signatures.Signatures == nil {
		// Read already refuses this; keep the invariant local and explicit.
		return nil, "", fmt.Errorf("bundle carries no signature")
	}
	rev := b.Manifest.Revision
	if rev == "" {
		rev = contentRevision(&b)
	}
	return &b, rev, nil
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

// mergeDataFile merges the JSON object in path into b.Data. A value the
// bundle already sets may not be redefined; objects merge key by key.
func mergeDataFile(b *bundle.Bundle, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var extra map[string]any
	if err := dec.Decode(&extra); err != nil {
		return fmt.Errorf("%s: want a JSON object: %w", filepath.Base(path), err)
	}
	if err := onlyTenants(extra); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
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
	_, rev, err := readBundle(path, vc)
	if err != nil {
		return "", fmt.Errorf("policy: bundle %s refused: %w", path, err)
	}
	return rev, nil
}
