package e2e

// What the kernel knows about this machine's UDP traffic, for the weida
// measurements: how many datagrams were sent, and how much waits in an
// endpoint's socket for its reader. Linux only; elsewhere the figures
// read as zero.

import (
	"os"
	"strconv"
	"strings"
)

// udpDatagramsSent is the machine's count of UDP datagrams sent
// (OutDatagrams in /proc/net/snmp), or 0 where there is no such file.
func udpDatagramsSent() int64 { return udpCounter("OutDatagrams") }

// udpCounter is the machine's UDP counter of that name in /proc/net/snmp
// (OutDatagrams, RcvbufErrors, SndbufErrors, ...), or 0 where there is no
// such file or counter.
func udpCounter(name string) int64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	var header []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "Udp:" {
			continue
		}
		if header == nil {
			header = fields
			continue
		}
		for i := range header {
			if header[i] == name && i < len(fields) {
				n, _ := strconv.ParseInt(fields[i], 10, 64)
				return n
			}
		}
	}
	return 0
}

// udpReceiveQueue is the bytes waiting in the receive queue of the UDP
// socket bound to port (the rx_queue column of /proc/net/udp and udp6,
// which counts the kernel's buffers, not only payload), or 0 where there
// is no such socket or file.
func udpReceiveQueue(port int) int64 {
	for _, file := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx_queue:rx_queue ...
			fields := strings.Fields(line)
			if len(fields) < 5 {
				continue
			}
			_, localPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(localPort, 16, 32); !ok || err != nil || int(p) != port {
				continue
			}
			_, rx, _ := strings.Cut(fields[4], ":")
			n, _ := strconv.ParseInt(rx, 16, 64)
			return n
		}
	}
	return 0
}
