// Package dnslabel is the one rule for names that become identities: a
// tenant, a tier or a namespace is a DNS-1123 label (RFC 1123, as
// Kubernetes checks namespace names), or it is refused. policy checks the
// names a bundle and a data file bring; netpol checks them again where a
// name becomes a fence identity, since a map key of fixed size would read
// "agents" and "agents\x00" as one tenant.
package dnslabel

import "fmt"

// MaxLen is the longest label, in bytes.
const MaxLen = 63

// Check returns nil when name is a DNS-1123 label: 1 to 63 lowercase ASCII
// letters, digits and '-', starting and ending with a letter or digit.
// Otherwise it says which part of the rule name breaks, as a phrase that
// follows the name: callers write fmt.Errorf("tenant %q %w", name, err).
func Check(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("is empty; want a DNS-1123 label (lowercase letters, digits and '-', at most %d bytes)", MaxLen)
	case len(name) > MaxLen:
		return fmt.Errorf("is %d bytes; a DNS-1123 label is at most %d", len(name), MaxLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			continue
		}
		if c == '-' && i != 0 && i != len(name)-1 {
			continue
		}
		if c == '-' {
			return fmt.Errorf("starts or ends with '-'; a DNS-1123 label starts and ends with a lowercase letter or digit")
		}
		return fmt.Errorf("holds %q at byte %d; a DNS-1123 label holds only lowercase letters, digits and '-'", name[i:i+1], i)
	}
	return nil
}
