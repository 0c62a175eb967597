package admission

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Config is the configuration of the bulkhead-webhook binary.
type Config struct {
	// Listen is the HTTPS address of /validate (and the probes).
	Listen string
	// ProbeListen, when set, also serves /healthz, /readyz and /metrics
	// over plain HTTP for the kubelet and Prometheus.
	ProbeListen string
	// TLSCert and TLSKey are PEM files, reloaded when they change (from
	// cert-manager or gen-tls.sh). Exclusive with CertSecret.
	TLSCert, TLSKey string
	// CertSecret, as NAMESPACE/NAME, turns the certificate rotator on
	// (Rotator): the webhook keeps its CA and serving certificate in that
	// Secret and publishes the CA in WebhookConfig's caBundle.
	CertSecret string
	// WebhookConfig is the ValidatingWebhookConfiguration whose caBundle the
	// rotator keeps; required with CertSecret.
	WebhookConfig string
	// CertService is the webhook's Service, in CertSecret's namespace,
	// whose names (ServiceDNSNames) the rotated certificate carries.
	CertService string
	// CertLifetime and CALifetime are RotatorOptions.CertLifetime and
	// CALifetime.
	CertLifetime, CALifetime time.Duration
	// Bundle, Key, KeyID, Scope, InsecureSkipVerification and Data are the
	// policy engine's options (policy.Options).
	Bundle                   string
	Key                      string
	KeyID                    string
	Scope                    string
	InsecureSkipVerification bool
	Data                     string
	// DecisionLog is a file for one JSON line per decision ("-": stdout).
	DecisionLog string
	// Evaluator is policy.Options.Evaluator: "plan" (default) or "topdown".
	Evaluator string
	// BundlePoll is how often the bundle file is checked for a new revision.
	BundlePoll time.Duration
	// Kubeconfig is used outside a cluster; empty means in-cluster config.
	Kubeconfig string
	// NoUsage disables the pod informer: quotas see zero usage. For tests
	// and clusters without pod list/watch rights.
	NoUsage bool
	// QuotaNamespace holds the tenants' quota ledgers (QuotaLedger), which
	// keep quotas with any number of replicas; DefaultQuotaNamespace unless
	// set. It must hold nothing else: the webhook may write every ConfigMap
	// there (a ledger's name is a tenant's, so RBAC cannot name them), and
	// it is never the namespace of --cert-secret, where Bulkhead keeps the
	// objects the nodes trust. Empty counts usage from the pod informer
	// alone, which only holds for one replica and no bursts.
	QuotaNamespace string
	// QuotaGrace is QuotaLedgerOptions.Grace.
	QuotaGrace time.Duration
	// AuditInterval is how often the running pods are judged against the
	// bundle in force (audit.go); 0 turns the audit off. It needs the
	// pod informer's client, so NoUsage turns it off too.
	AuditInterval time.Duration
	// AuditExcluded are the namespaces the audit leaves out, comma
	// separated.
	AuditExcluded string
	// MaxBodyBytes bounds an AdmissionReview body.
	MaxBodyBytes int64
	// MaxBufferedBytes bounds the request bodies held in memory at once.
	MaxBufferedBytes int64
	// MaxBundleBytes and MaxBundleFiles bound the policy bundle
	// (policy.Options.MaxBundleBytes, MaxBundleFiles).
	MaxBundleBytes int64
	MaxBundleFiles int
	// ClientCA, when set, is a PEM file of the CAs that sign the API
	// server's client certificate; every caller must then present one.
	ClientCA string
	// ClientNames restricts the client certificates ClientCA verifies to
	// these common or DNS names (empty: any it signed).
	ClientNames []string
	// ReadHeaderTimeout and ReadTimeout are the listener's read deadlines
	// (ServeOptions).
	ReadHeaderTimeout, ReadTimeout time.Duration
	// HTTP2 also offers HTTP/2 on the webhook listener.
	HTTP2 bool
	// GCPercent and MemoryLimit are the garbage collector's settings,
	// applied by ConfigureGC.
	GCPercent   int
	MemoryLimit string
	// Version asks the binary to print its version and exit; ParseFlags
	// then checks nothing else.
	Version bool
}

// ParseFlags reads the binary's flags. Errors name the flag and the rule.
func ParseFlags(args []string, output io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("bulkhead-webhook", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&c.Listen, "listen", ":8443", "HTTPS address for /validate, /healthz, /readyz, /metrics")
	fs.StringVar(&c.ProbeListen, "probe-listen", "", "plain HTTP address for /healthz, /readyz and /metrics only (empty: none)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serving certificate, PEM, reloaded when it changes (required unless --cert-secret)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "serving key, PEM, reloaded when it changes (required unless --cert-secret)")
	fs.StringVar(&c.CertSecret, "cert-secret", "", "NAMESPACE/NAME of a Secret where the webhook keeps its own CA and serving certificate, renewed before expiry, and turns the rotator on (instead of --tls-cert/--tls-key; needs --webhook-config)")
	fs.StringVar(&c.WebhookConfig, "webhook-config", "", "with --cert-secret, the ValidatingWebhookConfiguration whose webhooks' caBundle the rotator keeps to its CAs")
	fs.StringVar(&c.CertService, "cert-service", DefaultCertService, "with --cert-secret, the webhook's Service in the Secret's namespace: the certificate names NAME.NAMESPACE.svc (what the API server dials) and its shorter forms")
	fs.DurationVar(&c.CertLifetime, "cert-lifetime", DefaultCertLifetime, "with --cert-secret, the serving certificate's lifetime; renewed when a third is left")
	fs.DurationVar(&c.CALifetime, "ca-lifetime", DefaultCALifetime, "with --cert-secret, the CA's lifetime (at least 3 × --cert-lifetime); renewed when a third is left, published in caBundle before it signs")
	fs.StringVar(&c.Bundle, "bundle", "", "policy bundle, .tar.gz or directory (required)")
	fs.StringVar(&c.Key, "key", "", "public key (PEM file) that signs the bundle")
	fs.StringVar(&c.KeyID, "key-id", "", "key id the bundle's signature must name (required with --key)")
	fs.StringVar(&c.Scope, "scope", "", "scope the bundle's signature must carry (required with --key)")
	fs.BoolVar(&c.InsecureSkipVerification, "insecure-skip-verification", false, "load the bundle without checking its signature (development only)")
	fs.StringVar(&c.Data, "data", "", "extra data JSON merged into the bundle's data (unsigned)")
	fs.StringVar(&c.DecisionLog, "decision-log", "", "decision log file, - for stdout (empty: none)")
	fs.StringVar(&c.Evaluator, "evaluator", policy.EvaluatorPlan, "policy evaluator: plan (OPA's compiled plan, interpreter as fallback) or topdown (OPA's interpreter)")
	fs.Int64Var(&c.MaxBundleBytes, "max-bundle-bytes", policy.DefaultMaxBundleBytes, "largest policy bundle once inflated (and data file), refused before its signature is checked")
	fs.IntVar(&c.MaxBundleFiles, "max-bundle-files", policy.DefaultMaxBundleFiles, "most files a policy bundle may hold")
	fs.DurationVar(&c.BundlePoll, "bundle-poll", 10*time.Second, "how often to check the bundle for a new revision")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig outside a cluster (empty: in-cluster)")
	fs.BoolVar(&c.NoUsage, "no-usage", false, "do not watch pods; quotas see zero usage (and no audit)")
	fs.DurationVar(&c.AuditInterval, "audit-interval", DefaultAuditInterval, "how often to judge the running pods against the bundle in force and export what it would now refuse (bulkhead_audit_*); 0: no audit")
	fs.StringVar(&c.AuditExcluded, "audit-exclude-namespaces", strings.Join(DefaultAuditExcluded, ","), "comma-separated namespaces the audit leaves out (those the ValidatingWebhookConfiguration's namespaceSelector leaves out)")
	fs.StringVar(&c.QuotaNamespace, "quota-ledger-namespace", DefaultQuotaNamespace, "namespace of the tenants' quota ledgers (ConfigMaps updated with compare-and-swap, so that quotas hold across replicas), holding nothing else: never Bulkhead's own namespace; empty: count from the pod informer only (one replica)")
	fs.DurationVar(&c.QuotaGrace, "quota-grace", DefaultQuotaGrace, "how long a quota reservation is kept for a pod that is not seen live (admitted but never created)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", DefaultMaxBodyBytes, "largest AdmissionReview body accepted")
	fs.Int64Var(&c.MaxBufferedBytes, "max-buffered-bytes", DefaultMaxBufferedBytes, "request bodies held in memory at once; a request past it gets 503 at once")
	fs.StringVar(&c.ClientCA, "client-ca", "", "CA certificates (PEM) that sign the API server's client certificate; when set, every caller must present one (empty: no client authentication)")
	fs.Func("client-name", "with --client-ca, an identity (subject CN or DNS name) the client certificate must carry; repeatable (default: any the CA signed)", func(v string) error {
		if v == "" {
			return errors.New("must not be empty")
		}
		c.ClientNames = append(c.ClientNames, v)
		return nil
	})
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", DefaultReadHeaderTimeout, "deadline for a request's TLS handshake and headers")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", DefaultReadTimeout, "deadline for a whole request, body included (the API server gives up after the webhook's timeoutSeconds)")
	fs.BoolVar(&c.HTTP2, "http2", false, "also offer HTTP/2 on the webhook listener (the API server uses HTTP/1.1)")
	fs.IntVar(&c.GCPercent, "gc-percent", DefaultGCPercent, "heap growth in percent before a collection, used while a memory limit is in force (GOGC wins)")
	fs.StringVar(&c.MemoryLimit, "memory-limit", MemoryLimitAuto, "Go's soft memory limit: auto (90% of the container's limit), 0 (none) or a quantity such as 460Mi (GOMEMLIMIT wins)")
	fs.BoolVar(&c.Version, "version", false, "print the version, commit and Go release, and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.Version {
		return c, nil
	}
	if err := c.checkCertFlags(fs); err != nil {
		return c, err
	}
	switch {
	case c.Bundle == "":
		return c, errors.New("--bundle is required")
	case c.Key == "" && !c.InsecureSkipVerification:
		return c, errors.New("--key is required (or --insecure-skip-verification for development)")
	case c.Key != "" && (c.KeyID == "" || c.Scope == ""):
		return c, errors.New("--key-id and --scope are required with --key")
	case !policy.KnownEvaluator(c.Evaluator):
		return c, fmt.Errorf("--evaluator %q: must be %q or %q", c.Evaluator, policy.EvaluatorPlan, policy.EvaluatorTopdown)
	case c.BundlePoll <= 0:
		return c, fmt.Errorf("--bundle-poll %v: must be positive", c.BundlePoll)
	case c.MaxBodyBytes <= 0:
		return c, fmt.Errorf("--max-body-bytes %d: must be positive", c.MaxBodyBytes)
	case c.MaxBufferedBytes < c.MaxBodyBytes:
		return c, fmt.Errorf("--max-buffered-bytes %d: must be at least --max-body-bytes (%d)", c.MaxBufferedBytes, c.MaxBodyBytes)
	case c.MaxBundleBytes <= 0 || c.MaxBundleFiles <= 0:
		return c, fmt.Errorf("--max-bundle-bytes %d, --max-bundle-files %d: must be positive", c.MaxBundleBytes, c.MaxBundleFiles)
	case c.GCPercent <= 0:
		return c, fmt.Errorf("--gc-percent %d: must be positive", c.GCPercent)
	case c.QuotaGrace <= 0:
		return c, fmt.Errorf("--quota-grace %v: must be positive", c.QuotaGrace)
	case c.AuditInterval < 0 || (c.AuditInterval > 0 && c.AuditInterval < time.Second):
		return c, fmt.Errorf("--audit-interval %v: must be 0 (off) or at least 1s", c.AuditInterval)
	case len(c.ClientNames) > 0 && c.ClientCA == "":
		return c, errors.New("--client-name needs --client-ca")
	case c.ReadHeaderTimeout <= 0:
		return c, fmt.Errorf("--read-header-timeout %v: must be positive", c.ReadHeaderTimeout)
	case c.ReadTimeout <= 0:
		return c, fmt.Errorf("--read-timeout %v: must be positive", c.ReadTimeout)
	}
	if _, _, err := parseMemoryLimit(c.MemoryLimit); err != nil {
		return c, err
	}
	if err := c.checkQuotaNamespace(); err != nil {
		return c, err
	}
	return c, nil
}

// DefaultQuotaNamespace holds the quota ledgers in deploy/ and the chart: a
// namespace of their own, apart from bulkhead-system, whose ConfigMaps
// (the policy bundle, its key, the nodes' config and installer) no
// Bulkhead identity may write.
const DefaultQuotaNamespace = "bulkhead-quota"

// checkQuotaNamespace checks --quota-ledger-namespace: a namespace's name,
// and not the one where the webhook keeps its certificate (Bulkhead's own,
// whose ConfigMaps the nodes trust): the webhook may write every ConfigMap
// of the ledgers' namespace.
func (c *Config) checkQuotaNamespace() error {
	if c.QuotaNamespace == "" {
		return nil
	}
	if errs := validation.IsDNS1123Label(c.QuotaNamespace); len(errs) > 0 {
		return fmt.Errorf("--quota-ledger-namespace %q: a namespace's name: %s", c.QuotaNamespace, strings.Join(errs, "; "))
	}
	if c.CertSecret != "" {
		if ns, _, err := splitCertSecret(c.CertSecret); err == nil && ns == c.QuotaNamespace {
			return fmt.Errorf("--quota-ledger-namespace %q is --cert-secret's namespace: the ledgers need a namespace of their own (default %q), since the webhook may write every ConfigMap there", c.QuotaNamespace, DefaultQuotaNamespace)
		}
	}
	return nil
}

// DefaultCertService is the webhook's Service in deploy/webhook.
const DefaultCertService = "bulkhead-webhook"

// checkCertFlags checks the serving certificate's flags: files, or the
// rotator with everything it needs, never both.
func (c *Config) checkCertFlags(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.CertSecret == "" {
		for _, name := range []string{"webhook-config", "cert-service", "cert-lifetime", "ca-lifetime"} {
			if set[name] {
				return fmt.Errorf("--%s needs --cert-secret (it configures the certificate rotator)", name)
			}
		}
		if c.TLSCert == "" || c.TLSKey == "" {
			return errors.New("--tls-cert and --tls-key are required (or --cert-secret for certificates the webhook rotates itself)")
		}
		return nil
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		return errors.New("--cert-secret and --tls-cert/--tls-key: choose one: the rotator's Secret, or files kept by cert-manager or gen-tls.sh")
	}
	if _, _, err := splitCertSecret(c.CertSecret); err != nil {
		return err
	}
	if c.WebhookConfig == "" {
		return errors.New("--webhook-config is required with --cert-secret: the ValidatingWebhookConfiguration whose caBundle the rotator keeps")
	}
	if errs := validation.IsDNS1123Subdomain(c.WebhookConfig); len(errs) > 0 {
		return fmt.Errorf("--webhook-config %q: %s", c.WebhookConfig, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1035Label(c.CertService); len(errs) > 0 {
		return fmt.Errorf("--cert-service %q: a Service name: %s", c.CertService, strings.Join(errs, "; "))
	}
	if c.CertLifetime < minCertLifetime {
		return fmt.Errorf("--cert-lifetime %v: must be at least %v", c.CertLifetime, minCertLifetime)
	}
	if c.CALifetime < 3*c.CertLifetime {
		return fmt.Errorf("--ca-lifetime %v: must be at least 3 × --cert-lifetime (%v), so that a new CA is published for a whole certificate lifetime before the old one expires", c.CALifetime, 3*c.CertLifetime)
	}
	return nil
}

// splitCertSecret reads --cert-secret's NAMESPACE/NAME.
func splitCertSecret(v string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(v, "/")
	if !ok || namespace == "" || name == "" {
		return "", "", fmt.Errorf("--cert-secret %q: must be NAMESPACE/NAME", v)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("--cert-secret %q: namespace %q: %s", v, namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("--cert-secret %q: name %q: %s", v, name, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

// servingCerts is the certificate source the flags choose: files, or the
// rotator (returned too), synced once so that there is a pair to serve (it
// fails when there is none: RBAC, an unreachable API server) and then run
// until ctx ends.
func servingCerts(ctx context.Context, c Config, client kubernetes.Interface, logger *slog.Logger) (*CertReloader, *Rotator, error) {
	if c.CertSecret == "" {
		certs, err := NewCertReloader(c.TLSCert, c.TLSKey, logger)
		return certs, nil, err
	}
	namespace, name, err := splitCertSecret(c.CertSecret)
	if err != nil {
		return nil, nil, err
	}
	rot, err := NewRotator(RotatorOptions{
		Client: client, Namespace: namespace, Secret: name, WebhookConfig: c.WebhookConfig,
		DNSNames: ServiceDNSNames(namespace, c.CertService), CertLifetime: c.CertLifetime, CALifetime: c.CALifetime,
		Logger: logger,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := rot.Sync(ctx); err != nil {
		if rot.Certs().served() == nil {
			return nil, nil, fmt.Errorf("certificate rotator: %w", err)
		}
		logger.Warn("certificate rotator: serving, but the caBundle is not published yet; retrying", "err", err)
	}
	go func() {
		if err := rot.Run(ctx); err != nil {
			logger.Error("certificate rotator stopped", "err", err)
		}
	}()
	return rot.Certs(), rot, nil
}

// Run serves the webhook until ctx ends.
func Run(ctx context.Context, c Config, logger *slog.Logger) error {
	opts := policy.Options{
		BundlePath:               c.Bundle,
		InsecureSkipVerification: c.InsecureSkipVerification,
		DataPath:                 c.Data,
		DecisionLogFile:          c.DecisionLog,
		Evaluator:                c.Evaluator,
		MaxBundleBytes:           c.MaxBundleBytes,
		MaxBundleFiles:           c.MaxBundleFiles,
		Logger:                   logger,
	}
	if c.Key != "" {
		opts.Keys = map[string]string{c.KeyID: c.Key}
		opts.KeyID, opts.Scope = c.KeyID, c.Scope
	}
	engine, err := policy.Open(ctx, opts)
	if err != nil {
		return err
	}
	defer engine.Close()
	go func() {
		if err := engine.Watch(ctx, c.BundlePoll); err != nil && ctx.Err() == nil {
			logger.Error("policy bundle watch stopped", "err", err)
		}
	}()

	var client kubernetes.Interface
	if !c.NoUsage || c.CertSecret != "" {
		if client, err = kubeClient(c.Kubeconfig); err != nil {
			return err
		}
	}
	certs, rotator, err := servingCerts(ctx, c, client, logger)
	if err != nil {
		return err
	}
	var clientAuth *ClientAuth
	if c.ClientCA != "" {
		if clientAuth, err = LoadClientAuth(c.ClientCA, c.ClientNames); err != nil {
			return err
		}
	}
	metrics := NewMetrics()
	metrics.observeRevision(engine.Revision())
	// The revision in force as soon as a reload activates it, not at the
	// next decision: a quiet cluster would otherwise show the old one, and
	// BulkheadBundleStale compares the nodes' revisions with it.
	engine.OnReload(func(revision string, _ error) { metrics.observeRevision(revision) })
	metrics.WatchCertificate(certs)
	metrics.WatchRotator(rotator)
	reviewOpts := Options{Decider: engine, Metrics: metrics}
	ready := func() error { return nil }
	var ledger *QuotaLedger
	if !c.NoUsage {
		cluster, err := NewCluster(client)
		if err != nil {
			return err
		}
		reviewOpts.Handlers = cluster.Handlers
		reviewOpts.Claims = cluster.Claims
		if c.QuotaNamespace != "" {
			ledger, err = NewQuotaLedger(QuotaLedgerOptions{
				Client: client, Namespace: c.QuotaNamespace, Pods: cluster.Usage, PodInformer: cluster.Pods,
				Grace: c.QuotaGrace, Logger: logger,
			})
			if err != nil {
				return err
			}
			reviewOpts.Quota = ledger
		} else {
			reviewOpts.Usage = cluster.Usage
		}
		ready = cluster.Ready
		go func() {
			if err := cluster.Start(ctx); err != nil && ctx.Err() == nil {
				logger.Error("informers", "err", err)
			}
		}()
		if c.AuditInterval > 0 {
			auditor, err := NewAuditor(AuditOptions{
				Decider: engine, Pods: APIPods{Client: client}, Handlers: cluster.Handlers, Claims: cluster.Claims,
				Excluded: SplitList(c.AuditExcluded), Logger: logger,
			})
			if err != nil {
				return err
			}
			metrics.WatchAudit(auditor)
			go func() {
				// The handlers and claims the audit reads come from the
				// informers: judge nothing before they have synced.
				if !cache.WaitForCacheSync(ctx.Done(), func() bool { return cluster.Ready() == nil }) {
					return
				}
				auditor.Loop(ctx, c.AuditInterval)
			}()
		}
	}
	reviewer, err := NewReviewer(reviewOpts)
	if err != nil {
		return err
	}
	if ledger != nil {
		go func() {
			if err := ledger.Start(ctx, reviewer); err != nil && ctx.Err() == nil {
				logger.Error("quota ledger", "err", err)
			}
		}()
	}
	h, err := Handler(HandlerOptions{Reviewer: reviewer, MaxBodyBytes: c.MaxBodyBytes, MaxBufferedBytes: c.MaxBufferedBytes, Ready: ready, Metrics: metrics, Logger: logger})
	if err != nil {
		return err
	}
	if c.ProbeListen != "" {
		probes := &http.Server{Addr: c.ProbeListen, Handler: probeOnly(h), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := probes.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("probe listener", "addr", c.ProbeListen, "err", err)
			}
		}()
		defer probes.Close()
	}
	logger.Info("bulkhead webhook serving", "addr", c.Listen, "revision", engine.Revision(), "client_auth", clientAuth != nil, "http2", c.HTTP2)
	return Serve(ctx, ServeOptions{
		Addr: c.Listen, Certs: certs, Handler: h, Logger: logger, ClientAuth: clientAuth,
		ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout, HTTP2: c.HTTP2,
	})
}

// probeOnly serves everything h serves except /validate, which must only
// ever be reached over TLS.
func probeOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == PathValidate {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "bulkhead-webhook"
	// client-go's default client-side limit (5 requests/s, bursts of 10)
	// is too low for the quota ledger, which reads and writes a ConfigMap
	// in every admitted pod's review, again on each conflict: 20 pods
	// created at once waited in the limiter past the API server's 5 s
	// webhook timeout and were refused (fail closed). The reviews are
	// bounded by the webhook's own concurrency limit, and the API server's
	// priority and fairness protects it from the rest.
	cfg.QPS, cfg.Burst = ledgerQPS, ledgerBurst
	return kubernetes.NewForConfig(cfg)
}

// ledgerQPS and ledgerBurst are the webhook's client-side request limits.
const (
	ledgerQPS   = 100
	ledgerBurst = 200
)
