package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// verifySignature checks the signature of the tarball bundle raw against
// vc, and nothing else: it reads every file of the archive and hashes it
// as OPA's bundle reader does, through OPA's own functions
// (bundle.VerifyBundleSignature, bundle.VerifyBundleFile), but parses no
// module and no data. It is what a plan cache hit runs instead of
// readBundleFrom, whose verification it repeats at a fraction of the cost
// (parsing the modules is most of readBundleFrom's).
//
// It is never more permissive than readBundleFrom: every regular file but
// the signatures file must be listed by the signature with the digest it
// carries, under its name in the archive without a leading slash (OPA's
// tarball loader passes names through), every file the signature lists
// must be there, there is exactly one signatures file, and a delta
// bundle's patch file, which OPA's reader refuses under verification, is
// refused. The archive is read once, within lim as checkTarball bounds it
// (sizes counted from the headers before a file is inflated), and a
// malformed archive is refused.
func verifySignature(raw []byte, vc *bundle.VerificationConfig, lim bundleLimits) error {
	if vc == nil {
		return errors.New("no verification config")
	}
	gz, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("archive read failed: %w", err)
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	type file struct {
		name string
		data []byte
	}
	var (
		files    []file
		sigs     bundle.SignaturesConfig
		sigsName string
		total    int64
		count    int
	)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("archive read failed: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if count++; count > lim.files {
			return tooLarge("the archive holds more than MaxBundleFiles (%d) files"+limitKeys, lim.files)
		}
		if total += h.Size; h.Size < 0 || total > lim.bytes {
			return tooLarge("the archive inflates past MaxBundleBytes (%d bytes) at %s"+limitKeys, lim.bytes, h.Name)
		}
		f := file{name: strings.TrimPrefix(h.Name, "/"), data: make([]byte, h.Size)}
		if _, err := io.ReadFull(tr, f.data); err != nil {
			return fmt.Errorf("archive read failed: %s: %w", h.Name, err)
		}
		switch {
		case bundle.IsSignaturesFile(f.name):
			if sigsName != "" {
				return fmt.Errorf("bundle contains multiple signatures files: %q and %q", sigsName, f.name)
			}
			sigsName = f.name
			dec := json.NewDecoder(bytes.NewReader(f.data))
			dec.UseNumber()
			if err := dec.Decode(&sigs); err != nil {
				return fmt.Errorf("bundle load failed on signatures decode: %w", err)
			}
		case path.Base(f.name) == "patch.json":
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
		if err := bundle.VerifyBundleFile(f.name, *bytes.NewBuffer(f.data), signed); err != nil {
			return err
		}
	}
	if len(signed) != 0 {
		return fmt.Errorf("file(s) %v specified in bundle signatures but not found in the target bundle", slices.Sorted(maps.Keys(signed)))
	}
	return nil
}
