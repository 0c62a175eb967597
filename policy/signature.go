package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// verifySignature checks the signature of the tarball bundle raw (read from
// bundlePath) against vc, and nothing else: it reads every file of the
// archive and hashes it as OPA's bundle reader does, through OPA's own
// functions (bundle.VerifyBundleSignature, bundle.VerifyBundleFile), but
// parses no module and no data. It is what a plan cache hit runs instead
// of readBundleFrom, whose verification it repeats at a fraction of the
// cost (parsing the modules is most of readBundleFrom's).
//
// It is never more permissive than readBundleFrom: every file but the
// signatures file must be listed by the signature with the digest it
// carries, every file the signature lists must be there, there is exactly
// one signatures file, and a delta bundle's patch file, which OPA's reader
// refuses under verification, is refused.
func verifySignature(bundlePath string, raw []byte, vc *bundle.VerificationConfig, lim bundleLimits) error {
	if vc == nil {
		return errors.New("no verification config")
	}
	if err := checkTarball(raw, lim); err != nil {
		return err
	}
	loader := bundle.NewTarballLoaderWithBaseURL(bytes.NewReader(raw), bundlePath).WithSizeLimitBytes(lim.bytes)
	type file struct {
		path string
		data bytes.Buffer
	}
	var (
		files    []*file
		sigs     bundle.SignaturesConfig
		sigsPath string
	)
	for {
		d, err := loader.NextFile()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("bundle read failed: %w", err)
		}
		f := &file{path: strings.TrimPrefix(d.Path(), "/")}
		_, err = d.Read(&f.data, lim.bytes+1)
		d.Close()
		if err != nil && err != io.EOF {
			return fmt.Errorf("bundle read failed: %s: %w", f.path, err)
		}
		if int64(f.data.Len()) > lim.bytes {
			return tooLarge("%s is larger than MaxBundleBytes (%d bytes)"+limitKeys, f.path, lim.bytes)
		}
		switch {
		case bundle.IsSignaturesFile(f.path):
			if sigsPath != "" {
				return fmt.Errorf("bundle contains multiple signatures files: %q and %q", sigsPath, f.path)
			}
			sigsPath = f.path
			dec := json.NewDecoder(&f.data)
			dec.UseNumber()
			if err := dec.Decode(&sigs); err != nil {
				return fmt.Errorf("bundle load failed on signatures decode: %w", err)
			}
		case path.Base(f.path) == "patch.json":
			return errors.New("delta bundles do not support signature verification")
		default:
			files = append(files, f)
		}
	}
	if len(sigs.Signatures) == 0 {
		return errors.New("bundle carries no signature")
	}
	signed, err := bundle.VerifyBundleSignature(sigs, vc)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := bundle.VerifyBundleFile(f.path, f.data, signed); err != nil {
			return err
		}
	}
	if len(signed) != 0 {
		missing := make([]string, 0, len(signed))
		for name := range signed {
			missing = append(missing, name)
		}
		slices.Sort(missing)
		return fmt.Errorf("file(s) %v specified in bundle signatures but not found in the target bundle", missing)
	}
	return nil
}
