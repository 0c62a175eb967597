package image

import (
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"sort"
	"strings"
)

// Needs is what a binary needs of the host it runs on.
type Needs struct {
	// Static is true for a binary without an ELF interpreter or shared
	// libraries: it runs on any Linux of its architecture.
	Static bool
	// Libraries are the shared libraries it loads (DT_NEEDED), each with
	// the symbol versions it needs of it ("GLIBC_2.34"), sorted.
	Libraries map[string][]string
}

// ReadNeeds reads a binary's needs from its ELF headers.
func ReadNeeds(path string) (Needs, error) {
	f, err := elf.Open(path)
	if err != nil {
		return Needs{}, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	n := Needs{Libraries: map[string][]string{}}
	interp := false
	for _, p := range f.Progs {
		interp = interp || p.Type == elf.PT_INTERP
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return Needs{}, fmt.Errorf("%s: %w", path, err)
	}
	if !interp && len(libs) == 0 {
		n.Static = true
		return n, nil
	}
	for _, l := range libs {
		n.Libraries[l] = nil
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		return Needs{}, fmt.Errorf("%s: %w", path, err)
	}
	tags := map[string]map[string]bool{}
	for _, s := range syms {
		if s.Library == "" || s.Version == "" {
			continue
		}
		if tags[s.Library] == nil {
			tags[s.Library] = map[string]bool{}
		}
		tags[s.Library][s.Version] = true
	}
	for lib, set := range tags {
		for v := range set {
			n.Libraries[lib] = append(n.Libraries[lib], v)
		}
		sort.Strings(n.Libraries[lib])
	}
	return n, nil
}

// hostNeedsFile is the installer image's list of what each host binary
// needs, which install.sh checks on the host before it copies anything:
//
//	NAME static
//	NAME needs LIBRARY [VERSION...]
func hostNeedsFile(needs map[string]Needs) []byte {
	names := make([]string, 0, len(needs))
	for name := range needs {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("# What each host binary needs of the host (written by deploy/image; install.sh checks it).\n")
	for _, name := range names {
		n := needs[name]
		if n.Static {
			fmt.Fprintf(&b, "%s static\n", name)
			continue
		}
		libs := make([]string, 0, len(n.Libraries))
		for l := range n.Libraries {
			libs = append(libs, l)
		}
		sort.Strings(libs)
		for _, l := range libs {
			fmt.Fprintf(&b, "%s needs %s\n", name, strings.TrimSpace(l+" "+strings.Join(n.Libraries[l], " ")))
		}
	}
	return []byte(b.String())
}

// goRelease is the Go release a binary was built with.
func goRelease(path string) (string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: not a Go binary with build info: %w", path, err)
	}
	return bi.GoVersion, nil
}
