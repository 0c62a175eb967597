package image

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Deb is one Debian package the base layer is made of, pinned by version
// and by the .deb's sha256.
type Deb struct {
	// Package is the package name, e.g. "busybox-static".
	Package string
	// Version is the exact Debian version, epoch included ("1:1.35.0-4").
	Version string
	// Arch is the Debian architecture, e.g. "amd64".
	Arch string
	// SHA256 is the hex sha256 of the .deb file.
	SHA256 string
}

// BuildHostPackage is a package of the build host whose files end up in a
// binary: the C library and libseccomp that runc links statically, and the
// C compiler of the cgo binaries. Another version gives other bytes.
type BuildHostPackage struct {
	// Package is the Debian package name, e.g. "libseccomp-dev".
	Package string
	// Version is the version dpkg reports for it.
	Version string
}

// Lock is deploy/image/base.lock: what the images are built from.
type Lock struct {
	// Debs make up the base layer, in the order they are unpacked.
	Debs []Deb
	// BuildHost are the build host's packages the binaries depend on.
	BuildHost []BuildHostPackage
	// BaseDigest is the digest of the base image the Debs give
	// ("sha256:..."): the build refuses another.
	BaseDigest string
}

var (
	sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)
	debToken  = regexp.MustCompile(`^[A-Za-z0-9.+:~_-]+$`)
)

// ReadLock reads and validates a lock file: one directive a line,
//
//	deb PACKAGE VERSION ARCH SHA256
//	buildhost PACKAGE VERSION
//	base sha256:DIGEST
//
// with # comments. Unknown directives and malformed fields are errors that
// name the line.
func ReadLock(path string) (Lock, error) {
	f, err := os.Open(path)
	if err != nil {
		return Lock{}, fmt.Errorf("lock %s: %w", path, err)
	}
	defer f.Close()
	var l Lock
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("lock %s:%d: %s", path, n, fmt.Sprintf(format, args...))
		}
		for _, f := range fields[1:] {
			if !debToken.MatchString(f) {
				return Lock{}, bad("field %q: unexpected characters", f)
			}
		}
		switch fields[0] {
		case "deb":
			if len(fields) != 5 {
				return Lock{}, bad("want `deb PACKAGE VERSION ARCH SHA256`, got %d fields", len(fields))
			}
			d := Deb{Package: fields[1], Version: fields[2], Arch: fields[3], SHA256: fields[4]}
			if !sha256Hex.MatchString(d.SHA256) {
				return Lock{}, bad("sha256 %q: want 64 lower-case hex digits", d.SHA256)
			}
			l.Debs = append(l.Debs, d)
		case "buildhost":
			if len(fields) != 3 {
				return Lock{}, bad("want `buildhost PACKAGE VERSION`, got %d fields", len(fields))
			}
			l.BuildHost = append(l.BuildHost, BuildHostPackage{Package: fields[1], Version: fields[2]})
		case "base":
			if len(fields) != 2 || !strings.HasPrefix(fields[1], "sha256:") || !sha256Hex.MatchString(strings.TrimPrefix(fields[1], "sha256:")) {
				return Lock{}, bad("want `base sha256:DIGEST`")
			}
			if l.BaseDigest != "" {
				return Lock{}, bad("base given twice")
			}
			l.BaseDigest = fields[1]
		default:
			return Lock{}, bad("unknown directive %q (deb, buildhost or base)", fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return Lock{}, fmt.Errorf("lock %s: %w", path, err)
	}
	if len(l.Debs) == 0 {
		return Lock{}, fmt.Errorf("lock %s: no deb: the base layer needs at least busybox-static", path)
	}
	return l, nil
}

// FileName is the name apt-get download gives the .deb: the epoch's colon
// is written %3a.
func (d Deb) FileName() string {
	return fmt.Sprintf("%s_%s_%s.deb", d.Package, strings.ReplaceAll(d.Version, ":", "%3a"), d.Arch)
}
