// Command netprobe is a small static network probe baked into the test
// workload image: busybox's nc has no UDP and its ping needs raw sockets,
// which gVisor withholds by default.
//
//	netprobe serve tcp:8080 udp:9090 ...   answer "pong" on each
//	netprobe tcp|udp HOST:PORT             exit 0 when "pong" comes back
//	netprobe icmp HOST                     exit 0 on an echo reply
//	netprobe icmp6 HOST                    the same over ICMPv6
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

const timeout = 2 * time.Second

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: netprobe serve tcp:PORT|udp:PORT... | tcp|udp HOST:PORT | icmp|icmp6 HOST")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "tcp":
		err = probeTCP(os.Args[2])
	case "udp":
		err = probeUDP(os.Args[2])
	case "icmp":
		err = probeICMP(os.Args[2])
	case "icmp6":
		err = probeICMP6(os.Args[2])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netprobe:", err)
		os.Exit(1)
	}
	fmt.Println("pong")
}

func serve(specs []string) error {
	for _, s := range specs {
		proto, port, ok := strings.Cut(s, ":")
		if !ok {
			return fmt.Errorf("%q: want tcp:PORT or udp:PORT", s)
		}
		switch proto {
		case "tcp":
			l, err := net.Listen("tcp", ":"+port)
			if err != nil {
				return err
			}
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte("pong\n"))
					c.Close()
				}
			}()
		case "udp":
			pc, err := net.ListenPacket("udp", ":"+port)
			if err != nil {
				return err
			}
			go func() {
				buf := make([]byte, 1500)
				for {
					_, addr, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo([]byte("pong"), addr)
				}
			}()
		default:
			return fmt.Errorf("%q: protocol must be tcp or udp", s)
		}
	}
	select {}
}

func probeTCP(addr string) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "pong" {
		return fmt.Errorf("tcp %s: no pong (%q, %v)", addr, line, err)
	}
	return nil
}

func probeUDP(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for range 3 {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(timeout / 2))
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) == "pong" {
			return nil
		}
	}
	return fmt.Errorf("udp %s: no pong", addr)
}

// probeICMP sends an echo request through an unprivileged ICMP socket.
func probeICMP(host string) error {
	dst, err := net.ResolveIPAddr("ip4", host)
	if err != nil {
		return err
	}
	c, err := icmp.ListenPacket("udp4", "0.0.0.0")
	if err != nil {
		return fmt.Errorf("icmp socket: %w", err)
	}
	defer c.Close()
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("bulkhead")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.UDPAddr{IP: dst.IP}); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("icmp %s: no reply: %w", host, err)
		}
		if m, err := icmp.ParseMessage(1, buf[:n]); err == nil && m.Type == ipv4.ICMPTypeEchoReply {
			return nil
		}
	}
}

// probeICMP6 sends an ICMPv6 echo request through an unprivileged socket.
func probeICMP6(host string) error {
	dst, err := net.ResolveIPAddr("ip6", host)
	if err != nil {
		return err
	}
	c, err := icmp.ListenPacket("udp6", "::")
	if err != nil {
		return fmt.Errorf("icmp6 socket: %w", err)
	}
	defer c.Close()
	msg := icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("bulkhead")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.UDPAddr{IP: dst.IP, Zone: dst.Zone}); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("icmp6 %s: no reply: %w", host, err)
		}
		if m, err := icmp.ParseMessage(58, buf[:n]); err == nil && m.Type == ipv6.ICMPTypeEchoReply {
			return nil
		}
	}
}
