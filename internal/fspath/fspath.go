// Package fspath answers questions about slash-separated, cleaned host
// paths that more than one of Bulkhead's packages asks.
package fspath

import "strings"

// Under reports whether p is root or lies below it; both must be clean.
func Under(p, root string) bool {
	return p == root || strings.HasPrefix(p, root+"/") || root == "/"
}
