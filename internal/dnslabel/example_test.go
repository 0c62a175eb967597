package dnslabel_test

import (
	"fmt"

	"github.com/bulkhead-runtime/bulkhead/internal/dnslabel"
)

// A caller names the field and quotes the name; Check says what is wrong
// with it.
func ExampleCheck() {
	for _, tenant := range []string{"agents", "agents\x00", "Agents"} {
		if err := dnslabel.Check(tenant); err != nil {
			fmt.Printf("tenant %q %v\n", tenant, err)
			continue
		}
		fmt.Printf("tenant %q is a label\n", tenant)
	}
	// Output:
	// tenant "agents" is a label
	// tenant "agents\x00" holds "\x00" at byte 6; a DNS-1123 label holds only lowercase letters, digits and '-'
	// tenant "Agents" holds "A" at byte 0; a DNS-1123 label holds only lowercase letters, digits and '-'
}
