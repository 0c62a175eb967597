package docs

import (
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestREADMEConfigIsValid: the shim configuration the README shows is one
// the shim accepts (every key known, every value valid), so a reader who
// copies it starts from a file that loads.
func TestREADMEConfigIsValid(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := parseBlocks("README.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range bs {
		if b.lang != "toml" || !strings.Contains(b.text, "runsc_path") {
			continue
		}
		n++
		if _, err := config.Parse([]byte(b.text)); err != nil {
			t.Errorf("%s: the shim refuses the README's configuration: %v", b, err)
		}
	}
	if n == 0 {
		t.Fatal("README.md shows no shim configuration (a toml block with runsc_path)")
	}
}
