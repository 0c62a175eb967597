package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/containerd/log"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/bulkhead-runtime/bulkhead/mig"
	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
	"github.com/bulkhead-runtime/bulkhead/runtime"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// DefaultPollInterval is how often the plugin reads the GPUs and the
// ledger for a change of what it publishes when Options.PollInterval is 0.
const DefaultPollInterval = 5 * time.Second

// Options configure the plugin.
type Options struct {
	// Pipeline is the node's pipeline: its ledger, MIG backend and policy.
	// Required, with a MIG backend.
	Pipeline *runtime.Pipeline
	// NodeName is this node's name: the pool the plugin publishes and the
	// only one whose devices it prepares. Required.
	NodeName string
	// Client reaches the API server: the helper publishes ResourceSlices
	// through it and the plugin reads the pods a claim is reserved for (for
	// their runtime handler). Required.
	Client kubernetes.Interface
	// RegistrarDir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry). Required, absolute.
	RegistrarDir string
	// PluginDir is the plugin's own directory, where its dra.sock lives
	// (/var/lib/kubelet/plugins/mig.bulkhead.dev). Required, absolute.
	PluginDir string
	// PollInterval is how often the GPUs and the slices held outside DRA
	// are read for a change; 0 is DefaultPollInterval.
	PollInterval time.Duration
	// SweepInterval is how often the claims this node holds are looked up
	// in the API server, and those gone released (the first time once the
	// node's slices are published); 0 is DefaultSweepInterval.
	SweepInterval time.Duration
}

func (o Options) validate() error {
	var errs []error
	if o.Pipeline == nil || o.Pipeline.Node().Backend() == nil {
		errs = append(errs, errors.New("pipeline: must be set, with a MIG backend (mig.backend is none)"))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("node name: must be set"))
	}
	if o.Client == nil {
		errs = append(errs, errors.New("client: must be set (the plugin publishes through the API server)"))
	}
	for _, d := range []struct{ name, path string }{{"registrar dir", o.RegistrarDir}, {"plugin dir", o.PluginDir}} {
		if !filepath.IsAbs(d.path) {
			errs = append(errs, fmt.Errorf("%s %q: must be an absolute path", d.name, d.path))
		}
	}
	if o.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("poll interval %v: must not be negative", o.PollInterval))
	}
	if o.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("sweep interval %v: must not be negative", o.SweepInterval))
	}
	return errors.Join(errs...)
}

// Driver is the kubelet plugin: kubeletplugin.DRAPlugin over the node's
// pipeline.
type Driver struct {
	opts Options
	// helper is the kubelet plugin helper; nil until Start.
	helper *kubeletplugin.Helper
	// stopPublishing ends poll, which publishing waits for.
	stopPublishing context.CancelFunc
	publishing     sync.WaitGroup
	// mu guards published.
	mu sync.Mutex
	// published is what the ResourceSlices were last built from; nil
	// before the first publication.
	published *publication
	// now is the clock the orphan sweep counts ClaimGrace on.
	now func() time.Time
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New makes the plugin; Start serves it.
func New(o Options) (*Driver, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	return &Driver{opts: o, now: time.Now}, nil
}

// Start registers the plugin with the kubelet and, in the background,
// publishes the node's ResourceSlices and keeps them current until ctx
// ends or Stop.
func (d *Driver) Start(ctx context.Context) error {
	// The kubelet makes its registration directory; the plugin's own is
	// the plugin's to make.
	if st, err := os.Stat(d.opts.RegistrarDir); err != nil {
		return fmt.Errorf("dra: registrar dir (is the kubelet's plugins_registry mounted?): %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("dra: registrar dir %s: not a directory", d.opts.RegistrarDir)
	}
	if err := os.MkdirAll(d.opts.PluginDir, 0o750); err != nil {
		return fmt.Errorf("dra: plugin dir: %w", err)
	}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(migdra.DriverName),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		// No device health: WatchHealthStatus says so, and the service is
		// not advertised.
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return fmt.Errorf("dra: %w", err)
	}
	d.helper = h
	// Publishing waits for the API server (the first publication until
	// the helper has listed the node's slices): it never holds up the
	// agent, whose shims do not depend on it.
	ctx, d.stopPublishing = context.WithCancel(ctx)
	d.publishing.Add(1)
	go func() {
		defer d.publishing.Done()
		d.poll(ctx)
	}()
	return nil
}

// Stop unregisters the plugin and stops publishing. The ResourceSlices
// stay: the kubelet removes a node's slices when its plugin is gone for
// long, and a restarted agent publishes the same ones.
func (d *Driver) Stop() {
	d.stopPublishing()
	d.helper.Stop()
	d.publishing.Wait()
}

// publication is what the node's ResourceSlices are built from.
type publication struct {
	gpus []mig.GPUInfo
	// outside are the slices held outside DRA (the annotation path).
	outside []mig.Placement
}

// Resources are the node's ResourceSlices for gpus: mig/dra's publication
// in one pool named after the node, less every device that overlaps a
// slice held outside DRA (outside: pods that asked with the annotation),
// so that the scheduler does not allocate what the node would refuse to
// prepare. A GPU held whole outside DRA offers nothing. Slices keep their
// places when devices leave them: the order across slices is the
// placement policy. An empty pool still has one (empty) slice: it says
// that the driver runs and has nothing to offer.
func Resources(node string, gpus []mig.GPUInfo, outside []mig.Placement) (resourceslice.DriverResources, error) {
	slices, err := migdra.Publish(gpus, migdra.Options{})
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	pool := resourceslice.Pool{}
	for _, s := range slices {
		var devices []resourcev1.Device
		for _, dev := range s.Devices {
			part, err := migdra.PartitionOf(dev)
			if err != nil {
				return resourceslice.DriverResources{}, err
			}
			if !overlapsAny(part, outside) {
				devices = append(devices, dev)
			}
		}
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devices, SharedCounters: s.SharedCounters})
	}
	if len(pool.Slices) == 0 {
		pool.Slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}, nil
}

// overlapsAny reports whether part shares a memory slot with one of held
// (a whole GPU holds them all).
func overlapsAny(part migdra.Partition, held []mig.Placement) bool {
	for _, h := range held {
		if h.GPU != part.GPU {
			continue
		}
		if h.Whole() || h.Start < part.Start+part.Size && part.Start < h.Start+h.Size {
			return true
		}
	}
	return false
}

// current reads what the slices are built from: the backend's GPUs and the
// ledger's slices held outside DRA.
func (d *Driver) current() (*publication, error) {
	gpus, err := d.opts.Pipeline.Node().Backend().GPUs()
	if err != nil {
		return nil, fmt.Errorf("dra: gpus: %w", err)
	}
	pub := &publication{gpus: gpus}
	err = d.opts.Pipeline.Node().Ledger().View(func(tx *node.LedgerTx) error {
		all, err := tx.List()
		for _, r := range all {
			if r.Claim == nil && r.GPU != nil {
				pub.outside = append(pub.outside, *r.GPU)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	return pub, nil
}

// publish publishes the node's slices when what they are built from
// changed since the last publication.
func (d *Driver) publish(ctx context.Context) error {
	pub, err := d.current()
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.published != nil && reflect.DeepEqual(pub, d.published) {
		return nil
	}
	res, err := Resources(d.opts.NodeName, pub.gpus, pub.outside)
	if err != nil {
		return fmt.Errorf("dra: %w", err)
	}
	if err := d.helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("dra: %w", err)
	}
	d.published = pub
	log.G(ctx).Infof("dra: published %d slice(s) of %d GPU(s) for node %s, %d slice(s) held outside DRA withdrawn", len(res.Pools[d.opts.NodeName].Slices), len(pub.gpus), d.opts.NodeName, len(pub.outside))
	return nil
}

// poll publishes, then republishes when what the slices are built from
// changes, until ctx ends. Once the slices are published it sweeps the
// claims that are gone, then again every SweepInterval.
func (d *Driver) poll(ctx context.Context) {
	// sweep is nil until the first publication: a nil channel is never
	// ready.
	var sweep *time.Ticker
	var sweeps <-chan time.Time
	defer func() {
		if sweep != nil {
			sweep.Stop()
		}
	}()
	published := func(err error, what string) {
		if err != nil {
			log.G(ctx).WithError(err).Warn(what)
			return
		}
		if sweep == nil {
			d.sweepLogged(ctx)
			sweep = time.NewTicker(d.opts.SweepInterval)
			sweeps = sweep.C
		}
	}
	published(d.publish(ctx), "dra: publishing the node's GPUs")
	t := time.NewTicker(d.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			published(d.publish(ctx), "dra: republishing the node's GPUs")
		case <-sweeps:
			d.sweepLogged(ctx)
		}
	}
}

// sweepLogged sweeps, logging what it could not look up or release: a
// later sweep tries those again.
func (d *Driver) sweepLogged(ctx context.Context) {
	if _, err := d.sweep(ctx, d.now()); err != nil {
		log.G(ctx).WithError(err).Warn("dra: sweeping claims that are gone")
	}
}

// PrepareResourceClaims prepares each claim's device of this driver on
// this node (runtime.Pipeline.PrepareClaim). A claim's refusal is its
// own error; the others are prepared.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	gpus, err := d.opts.Pipeline.Node().Backend().GPUs()
	if err != nil {
		return nil, fmt.Errorf("dra: gpus: %w", err)
	}
	devices, err := publishedDevices(gpus)
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = d.prepare(ctx, c, devices)
	}
	return out, nil
}

// publishedDevices are the devices published for gpus, by name.
func publishedDevices(gpus []mig.GPUInfo) (map[string]resourcev1.Device, error) {
	slices, err := migdra.Publish(gpus, migdra.Options{})
	if err != nil {
		return nil, err
	}
	out := map[string]resourcev1.Device{}
	for _, s := range slices {
		for _, dev := range s.Devices {
			out[dev.Name] = dev
		}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourcev1.ResourceClaim, devices map[string]resourcev1.Device) kubeletplugin.PrepareResult {
	fail := func(err error) kubeletplugin.PrepareResult {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
	}
	if c.Status.Allocation == nil {
		return fail(errors.New("not allocated"))
	}
	var mine []resourcev1.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == migdra.DriverName && r.Pool == d.opts.NodeName {
			mine = append(mine, r)
		}
	}
	switch len(mine) {
	case 0:
		return kubeletplugin.PrepareResult{}
	case 1:
	default:
		return fail(fmt.Errorf("%d devices of %s: a claim holds one MIG slice (a pod may list several claims)", len(mine), migdra.DriverName))
	}
	r := mine[0]
	dev, ok := devices[r.Device]
	if !ok {
		return fail(fmt.Errorf("device %s: not a device this node publishes now (a GPU left or changed MIG mode?)", r.Device))
	}
	part, err := migdra.PartitionOf(dev)
	if err != nil {
		return fail(err)
	}
	pod, handler, err := d.consumer(ctx, c)
	if err != nil {
		return fail(err)
	}
	id, err := d.opts.Pipeline.PrepareClaim(ctx, runtime.Claim{
		UID: string(c.UID), Namespace: c.Namespace, Name: c.Name, Pod: pod, Handler: handler,
		Device: r.Device, GPU: part.GPU, Profile: part.Profile, Start: part.Start,
	})
	if err != nil {
		var refused *runtime.RefusedError
		if errors.As(err, &refused) {
			return kubeletplugin.PrepareResult{Err: err}
		}
		return fail(err)
	}
	return kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{
		Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id},
	}}}
}

// consumer is the first pod the claim is reserved for and its runtime
// handler ("" when it names no RuntimeClass): the policy judges the
// claim for the runtime that pod runs under. A claim reserved for no pod
// is judged without one.
func (d *Driver) consumer(ctx context.Context, c *resourcev1.ResourceClaim) (pod, handler string, err error) {
	for _, ref := range c.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		p, err := d.opts.Client.CoreV1().Pods(c.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return "", "", fmt.Errorf("pod %s/%s the claim is reserved for: %w", c.Namespace, ref.Name, err)
		}
		if p.UID != ref.UID {
			return "", "", fmt.Errorf("pod %s/%s: uid %s, the claim is reserved for %s", c.Namespace, ref.Name, p.UID, ref.UID)
		}
		if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName == "" {
			return ref.Name, "", nil
		}
		rc, err := d.opts.Client.NodeV1().RuntimeClasses().Get(ctx, *p.Spec.RuntimeClassName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", "", fmt.Errorf("pod %s/%s: RuntimeClass %q does not exist", c.Namespace, ref.Name, *p.Spec.RuntimeClassName)
		}
		if err != nil {
			return "", "", fmt.Errorf("pod %s/%s: RuntimeClass %q: %w", c.Namespace, ref.Name, *p.Spec.RuntimeClassName, err)
		}
		return ref.Name, rc.Handler, nil
	}
	return "", "", nil
}

// UnprepareResourceClaims releases each claim's device
// (runtime.Pipeline.UnprepareClaim), from the ledger alone.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		if err := d.opts.Pipeline.UnprepareClaim(ctx, string(c.UID)); err != nil {
			out[c.UID] = fmt.Errorf("claim %s: %w", c.NamespacedName, err)
			continue
		}
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError logs what the helper met in the background (publishing
// ResourceSlices, its gRPC servers). None stops the agent: the shims'
// pods do not depend on the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	entry := log.G(ctx).WithError(err)
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		entry.Warnf("dra: %s", msg)
		return
	}
	entry.Errorf("dra: %s", msg)
}

// WatchHealthStatus reports no device health.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
