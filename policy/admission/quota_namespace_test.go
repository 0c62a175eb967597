package admission

import (
	"io"
	"strings"
	"testing"
)

// TestParseFlagsQuotaNamespace: the ledgers get a namespace of their own by
// default; a name that is no namespace's is refused, and so is the
// namespace of the webhook's certificate Secret (Bulkhead's own, whose
// ConfigMaps the nodes trust), since the webhook may write every ConfigMap
// of the ledgers' namespace.
func TestParseFlagsQuotaNamespace(t *testing.T) {
	files := []string{"--bundle=b", "--insecure-skip-verification", "--tls-cert=c", "--tls-key=k"}
	rotator := []string{"--bundle=b", "--insecure-skip-verification", "--cert-secret=bulkhead-system/bulkhead-webhook-cert", "--webhook-config=bulkhead"}
	for _, tc := range []struct {
		base, args []string
		want       string // the namespace; or, with err, an error substring
		err        bool
	}{
		{files, nil, DefaultQuotaNamespace, false},
		{rotator, nil, DefaultQuotaNamespace, false},
		{files, []string{"--quota-ledger-namespace="}, "", false},
		{rotator, []string{"--quota-ledger-namespace=tenants-quota"}, "tenants-quota", false},
		{files, []string{"--quota-ledger-namespace=bulkhead-system"}, "bulkhead-system", false},
		{rotator, []string{"--quota-ledger-namespace=bulkhead-system"}, `--quota-ledger-namespace "bulkhead-system" is --cert-secret's namespace`, true},
		{files, []string{"--quota-ledger-namespace=Bulkhead_Quota"}, `--quota-ledger-namespace "Bulkhead_Quota": a namespace's name`, true},
		{files, []string{"--quota-ledger-namespace=a/b"}, `--quota-ledger-namespace "a/b"`, true},
	} {
		t.Run(tc.base[2]+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			c, err := ParseFlags(append(append([]string{}, tc.base...), tc.args...), io.Discard)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.QuotaNamespace != tc.want {
				t.Errorf("QuotaNamespace %q, want %q", c.QuotaNamespace, tc.want)
			}
		})
	}
	if DefaultQuotaNamespace == "bulkhead-system" {
		t.Error("the ledgers' default namespace is Bulkhead's own")
	}
}
