package netpol

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// BenchmarkProgram measures the fence's per-packet cost with
// BPF_PROG_TEST_RUN at 10, 1k and 100k registered endpoints (each with an
// IPv4 and an IPv6 address in the tenant tries), against a program that only
// returns TCX_NEXT, measured interleaved in the same run. Each op runs the
// program 1000 times; p50/p99 are over those per-op averages. verified-insns
// is the verifier's count of processed instructions for the direction's
// program (all paths, not this packet's).
func BenchmarkProgram(b *testing.B) {
	requireBPF(b)
	baseline, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, verdictNext), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer baseline.Close()

	type benchFrame struct {
		name  string
		dir   Direction
		frame []byte
	}
	frames := []benchFrame{
		{"v4-same-tenant-pass", FromPod, ipv4(podV4, sameV4, 6, tcp(40000, 80), v4opts{})},
		{"v4-other-tenant-drop", FromPod, ipv4(podV4, otherV4, 6, tcp(40000, 80), v4opts{})},
		{"v6-same-tenant-pass", ToPod, ipv6(sameRDMAv6, podV6, 6, tcp(80, 40000))},
		{"v4-egress-allowlist-pass", FromPod, ipv4(podV4, allowedV4, 6, tcp(40000, 443), v4opts{})},
		// Neighbour discovery's longest pass path: a solicitation to the pod
		// from a pod of its tenant (destination, target and tenant checks).
		{"v6-nd-solicitation-to-pod-pass", ToPod, nd6(sameLL, "ff02::1:ff00:1", 135, podV6)},
		// The pod's own solicitation, with its source link-layer option
		// (checked against its MAC), to a solicited-node group.
		{"v6-nd-solicitation-from-pod-pass", FromPod, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, sameRDMAv6), lla(1, podMAC))},
	}
	for _, endpoints := range []int{10, 1000, 100000} {
		// A peer among the registered endpoints, of the pod's tenant: its
		// lookup goes as deep as that many addresses make it.
		peer4, peer6 := populatedAddrs(endpoints / 2 / 100 * 100)
		frames := append(slices.Clone(frames),
			benchFrame{"v4-same-tenant-pass-peer-among-all", FromPod, ipv4(podV4, peer4.String(), 6, tcp(40000, 80), v4opts{})},
			benchFrame{"v6-same-tenant-pass-peer-among-all", ToPod, ipv6(peer6.String(), podV6, 6, tcp(80, 40000))},
		)
		d := loadFixture(b)
		e := podEndpoint(restrict)
		if err := d.install(newRecord(&e, loIfindex, "lo", tenantA, tierStd)); err != nil {
			b.Fatal(err)
		}
		if err := populate(d, endpoints); err != nil {
			b.Fatal(err)
		}
		for _, f := range frames {
			b.Run(fmt.Sprintf("endpoints=%d/%s", endpoints, f.name), func(b *testing.B) {
				prog := d.program(f.dir)
				const repeat = 1000
				var fence, base []float64
				// The case measures what its name says.
				if ret, err := prog.Run(&ebpf.RunOptions{Data: f.frame}); err != nil {
					b.Fatal(err)
				} else if pass := ret == uint32(verdictNext&0xffffffff); pass != strings.Contains(f.name, "-pass") {
					b.Fatalf("%s: verdict %d", f.name, int32(ret))
				}
				for b.Loop() {
					_, dt, err := prog.Benchmark(f.frame, repeat, nil)
					if err != nil {
						b.Fatal(err)
					}
					fence = append(fence, float64(dt.Nanoseconds()))
					_, dt, err = baseline.Benchmark(f.frame, repeat, nil)
					if err != nil {
						b.Fatal(err)
					}
					base = append(base, float64(dt.Nanoseconds()))
				}
				b.ReportMetric(mean(fence), "ns/pkt")
				b.ReportMetric(percentile(fence, 50), "p50-ns/pkt")
				b.ReportMetric(percentile(fence, 99), "p99-ns/pkt")
				b.ReportMetric(mean(base), "baseline-ns/pkt")
				b.ReportMetric(mean(fence)-mean(base), "added-ns/pkt")
				b.ReportMetric(percentile(fence, 50)-percentile(base, 50), "added-p50-ns/pkt")
				if info, err := prog.Info(); err == nil {
					if n, ok := info.VerifiedInstructions(); ok {
						b.ReportMetric(float64(n), "verified-insns")
					}
				}
			})
		}
	}
}

// populate registers n endpoints besides the fixture's, of 100 tenants;
// every hundredth is of the fixture pod's tenant.
func populate(d *datapath, n int) error {
	for i := range n {
		ifindex := uint32(1000 + i)
		v4, v6 := populatedAddrs(i)
		e := Endpoint{SandboxID: fmt.Sprintf("bench-%d", i), Ifindex: int(ifindex), Tenant: "x", Tier: "standard",
			IPv4: v4, IPv6: v6}
		tenant := uint32(3 + i%100)
		if i%100 == 0 {
			tenant = tenantA
		}
		if err := d.install(newRecord(&e, int(ifindex), "bench", tenant, tierStd)); err != nil {
			return fmt.Errorf("endpoint %d: %w", i, err)
		}
	}
	return nil
}

// populatedAddrs are the addresses populate gives endpoint i.
func populatedAddrs(i int) (netip.Addr, netip.Addr) {
	var a16 [16]byte
	a16[0], a16[1] = 0xfd, 0x01
	binary.BigEndian.PutUint32(a16[12:], uint32(i))
	return netip.AddrFrom4([4]byte{10, 100 + byte(i>>16), byte(i >> 8), byte(i)}), netip.AddrFrom16(a16)
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(max(len(xs), 1))
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

// BenchmarkVeth measures TCP over veth pairs on a bridge: one pod pair
// fenced (both ends registered, same tenant), one not, used alternately in
// the same run so that both see the same machine. Reported: throughput of
// each, their ratio over the whole run and the median of per-round ratios
// (target >= 0.95), and request/response round trips of each with the added
// latency at the median and on average (target <= 5%).
func BenchmarkVeth(b *testing.B) {
	n := newTestNet(b)
	ctx := context.Background()
	a1, a2 := n.addPod("a1", 1), n.addPod("a2", 2)
	c1, c2 := n.addPod("c1", 11), n.addPod("c2", 12)
	m := n.open(ctx, nil)
	defer m.Close()
	for _, p := range []*testPod{a1, a2} {
		if err := m.Register(ctx, n.endpoint(p, "tenant-a", nil)); err != nil {
			b.Fatal(err)
		}
	}
	dial := func(from, to *testPod, port uint16) net.Conn {
		var c net.Conn
		var err error
		n.inPod(from, func() {
			c, err = net.Dial("tcp", netip.AddrPortFrom(to.v4, port).String())
		})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}

	b.Run("tcp-throughput", func(b *testing.B) {
		n.enter()
		fenced, plain := dial(a1, a2, sinkPort), dial(c1, c2, sinkPort)
		defer fenced.Close()
		defer plain.Close()
		const round = 16 << 20
		buf := make([]byte, 256<<10)
		var tf, tp time.Duration
		var ratios []float64
		i := 0
		for b.Loop() {
			// Alternate which goes first so neither always gets the warmer
			// machine; pair each round's two transfers for a ratio.
			var df, dp time.Duration
			if i%2 == 0 {
				df, dp = transfer(b, fenced, buf, round), transfer(b, plain, buf, round)
			} else {
				dp, df = transfer(b, plain, buf, round), transfer(b, fenced, buf, round)
			}
			i++
			tf, tp = tf+df, tp+dp
			ratios = append(ratios, dp.Seconds()/df.Seconds())
		}
		gbps := func(d time.Duration) float64 { return float64(b.N) * round * 8 / d.Seconds() / 1e9 }
		b.ReportMetric(gbps(tf), "fenced-Gbit/s")
		b.ReportMetric(gbps(tp), "baseline-Gbit/s")
		b.ReportMetric(gbps(tf)/gbps(tp), "throughput-ratio")
		b.ReportMetric(percentile(ratios, 50), "throughput-ratio-median")
	})

	b.Run("tcp-request-response", func(b *testing.B) {
		n.enter()
		fenced, plain := dial(a1, a2, rrPort), dial(c1, c2, rrPort)
		defer fenced.Close()
		defer plain.Close()
		const round = 200
		var rf, rp []float64
		i := 0
		for b.Loop() {
			if i%2 == 0 {
				rf = append(rf, pingPong(b, fenced, round)...)
				rp = append(rp, pingPong(b, plain, round)...)
			} else {
				rp = append(rp, pingPong(b, plain, round)...)
				rf = append(rf, pingPong(b, fenced, round)...)
			}
			i++
		}
		b.ReportMetric(percentile(rf, 50), "fenced-p50-us/rr")
		b.ReportMetric(percentile(rf, 99), "fenced-p99-us/rr")
		b.ReportMetric(percentile(rp, 50), "baseline-p50-us/rr")
		b.ReportMetric(percentile(rp, 99), "baseline-p99-us/rr")
		b.ReportMetric(1e6/mean(rf), "fenced-rr/s")
		b.ReportMetric(1e6/mean(rp), "baseline-rr/s")
		b.ReportMetric((percentile(rf, 50)/percentile(rp, 50)-1)*100, "added-latency-p50-%")
		b.ReportMetric((mean(rf)/mean(rp)-1)*100, "added-latency-mean-%")
	})
}

// transfer sends n bytes through the sink and waits for its receipt.
func transfer(b *testing.B, c net.Conn, buf []byte, n int) time.Duration {
	start := time.Now()
	if _, err := c.Write(binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
		b.Fatal(err)
	}
	for left := n; left > 0; {
		k := min(left, len(buf))
		if _, err := c.Write(buf[:k]); err != nil {
			b.Fatal(err)
		}
		left -= k
	}
	if _, err := c.Read(buf[:1]); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// pingPong does n one-byte round trips and returns each in microseconds.
func pingPong(b *testing.B, c net.Conn, n int) []float64 {
	out := make([]float64, 0, n)
	one := []byte{'x'}
	for range n {
		start := time.Now()
		if _, err := c.Write(one); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Read(one); err != nil {
			b.Fatal(err)
		}
		out = append(out, float64(time.Since(start).Nanoseconds())/1e3)
	}
	return out
}
