package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

// policyAudit judges the cluster's running pods against a bundle, as the
// webhook's audit does against the bundle in force: before a new revision
// is rolled out, it says which running pods that revision would refuse.
func policyAudit(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy audit", "--bundle PATH [flags]", stderr)
	bf := addBundleFlags(fs)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG, then ~/.kube/config)")
	exclude := fs.String("exclude-namespaces", strings.Join(admission.DefaultAuditExcluded, ","), "comma-separated namespaces not judged (the webhook's namespaceSelector leaves them out)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	if rc := bf.check(fs); rc >= 0 {
		return rc
	}
	if *timeout <= 0 {
		return usageError(fs, "--timeout %v: must be above 0", *timeout)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if *kubeconfig != "" {
		rules.ExplicitPath = *kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy audit: --kubeconfig:", err)
		return exitError
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy audit:", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	e, err := policy.Open(ctx, bf.options("policy audit", stderr))
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy audit:", flagNames(err))
		return exitError
	}
	defer e.Close()
	a, err := admission.NewAuditor(admission.AuditOptions{
		Decider:  e,
		Pods:     admission.APIPods{Client: client},
		Handlers: admission.APIHandlers{Client: client},
		Claims:   admission.APIClaims{Client: client},
		Excluded: admission.SplitList(*exclude),
	})
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy audit:", err)
		return exitError
	}
	rep, err := a.Run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy audit:", err)
		return exitError
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "bulkhead policy audit:", err)
			return exitError
		}
	} else {
		printAudit(stdout, rep)
	}
	if rep.Refused > 0 || rep.Errors > 0 {
		return exitDeny
	}
	return exitOK
}

func printAudit(w io.Writer, rep admission.AuditReport) {
	fmt.Fprintf(w, "bundle revision %s: %d running pods judged, %d would be refused, %d could not be judged\n",
		rep.Revision, rep.Pods, rep.Refused, rep.Errors)
	if len(rep.Findings) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tTENANT\tTIER\tRULE\tWHY")
	for _, f := range rep.Findings {
		if f.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\tnot judged: %s\n", f.Namespace, f.Pod, dash(f.Tenant), dash(f.Tier), f.Error)
			continue
		}
		for i, r := range f.Reasons {
			ns, pod := f.Namespace, f.Pod
			if i > 0 {
				ns, pod = "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ns, pod, dash(f.Tenant), dash(f.Tier), r.Rule, r.Message)
		}
	}
	tw.Flush()
	if rep.Truncated {
		fmt.Fprintln(w, "(more pods were counted than listed)")
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
