package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"weida.dev/connector/service"
	"weida.dev/connector/service/placement"
	"weida.dev/connector/weida"
)

// placementFlags are the flags of `connector run` that share the
// resources among replicas through leases (docs/OPERATIONS.md, High
// availability).
type placementFlags struct {
	backend       *string
	replicaID     *string
	etcdEndpoints *string
	etcdPrefix    *string
	namespace     *string
	leasePrefix   *string
	lease         *time.Duration
	renewDeadline *time.Duration
	retry         *time.Duration
	resetKeyFile  *string
}

func addPlacementFlags(fs *flag.FlagSet) *placementFlags {
	d := placement.DefaultTiming
	return &placementFlags{
		backend:       fs.String("placement", "", "share the resources among replicas through leases on a coordination service: etcd or kubernetes; empty runs every resource in this process"),
		replicaID:     fs.String("replica-id", "", "this replica's identity among those sharing the leases, unique among live replicas (default: the host name; in Kubernetes, the pod name)"),
		etcdEndpoints: fs.String("etcd-endpoints", "", "with --placement etcd: the etcd members' client URLs, comma-separated (http://10.0.0.1:2379,...)"),
		etcdPrefix:    fs.String("etcd-prefix", "/weida-connector/", "with --placement etcd: the key prefix of the leases"),
		namespace:     fs.String("lease-namespace", "", "with --placement kubernetes: the namespace of the Lease objects (default: the pod's own)"),
		leasePrefix:   fs.String("lease-prefix", "weida-connector.", "with --placement kubernetes: the name prefix of the Lease objects"),
		lease:         fs.Duration("lease-duration", d.LeaseDuration, "how long a lease lasts after its last renewal before another replica may take it over (whole seconds); the same on every replica. A crashed holder's resources run elsewhere about this plus --lease-retry after the crash"),
		renewDeadline: fs.Duration("lease-renew-deadline", d.RenewDeadline, "a holder that has not renewed for this long stops the resource; shorter than --lease-duration"),
		retry:         fs.Duration("lease-retry", d.RetryPeriod, "how often a holder renews and a standby tries to take a free lease; shorter than --lease-renew-deadline"),
		// A process flag, not a resource field: the key belongs to the UDP
		// transport of a listen address, which every resource on that
		// address shares, and it is the replica's, like --state-dir, which
		// it overrides for the key.
		resetKeyFile: fs.String("reset-key-file", "", "the QUIC stateless reset key of every hosted endpoint: a file of 32 bytes or 64 hex digits (openssl rand -hex 32), the same on every replica, so that subscribers of an endpoint that moved learn at once that their connection is gone (default: kept in --state-dir)"),
	}
}

// resetKey returns --reset-key-file, checked: a file that cannot serve
// is refused before anything starts, rather than by every listener.
func (f *placementFlags) resetKey() (string, error) {
	if *f.resetKeyFile == "" {
		return "", nil
	}
	if err := weida.CheckResetKeyFile(*f.resetKeyFile); err != nil {
		return "", fmt.Errorf("--reset-key-file: %w", err)
	}
	return *f.resetKeyFile, nil
}

// placement checks the flags; hostname names the replica when
// --replica-id is not given.
func (f *placementFlags) placement(hostname func() (string, error)) (service.Placement, error) {
	p := service.Placement{
		Backend:     *f.backend,
		Identity:    *f.replicaID,
		EtcdPrefix:  *f.etcdPrefix,
		Namespace:   *f.namespace,
		LeasePrefix: *f.leasePrefix,
		Timing:      placement.Timing{LeaseDuration: *f.lease, RenewDeadline: *f.renewDeadline, RetryPeriod: *f.retry},
	}
	for _, e := range strings.Split(*f.etcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			p.EtcdEndpoints = append(p.EtcdEndpoints, e)
		}
	}
	switch p.Backend {
	case "":
		return service.Placement{}, nil
	case "etcd":
		if len(p.EtcdEndpoints) == 0 {
			return p, errors.New("--placement etcd needs --etcd-endpoints")
		}
	case "kubernetes":
	default:
		return p, fmt.Errorf("--placement must be etcd or kubernetes, not %q", p.Backend)
	}
	if p.Identity == "" {
		h, err := hostname()
		if err != nil || h == "" {
			return p, fmt.Errorf("--placement needs --replica-id: the host name is unknown (%v)", err)
		}
		p.Identity = h
	}
	if _, err := p.Timing.WithDefaults(); err != nil {
		return p, fmt.Errorf("--lease-retry, --lease-renew-deadline and --lease-duration: %w", err)
	}
	return p, nil
}

// drainWarning returns the warning `connector run` logs at start, with its
// attributes, when --drain is longer than a resource given up by its
// replica can be sure to drain; "" when placement is off or the drain fits.
//
// The comparison. On SIGTERM the resources drain while their leases are
// still renewed, and are released only after: any --drain is safe there.
// The risk is a holding that ends while its lease is no longer renewed.
// Since the data path checks the holding before every act (service,
// fence), such a holder never acknowledges or publishes after its renew
// deadline, which falls the margin (lease duration minus renew deadline)
// before the lease can expire: safety no longer depends on --drain. What
// does is how much of the drain a holding can use. A lost lease (its
// deadline passed) fences at once, whatever the drain. A holding the
// replica gives up itself while healthy (a rebalance, when a replica
// joins) stops renewing as it ends, and may act until its deadline, which
// is then at least the renew deadline minus one retry period away (the
// last renewal went out at most one retry period before). A longer drain
// is cut there: what is still in flight is fenced (left to the broker for
// the next holder, or counted as fenced where the broker would not deliver
// it again) rather than settled.
func drainWarning(drain time.Duration, p service.Placement) (string, []any) {
	if !p.Enabled() {
		return "", nil
	}
	t, err := p.Timing.WithDefaults()
	usable := t.RenewDeadline - t.RetryPeriod
	if err != nil || drain <= usable {
		return "", nil
	}
	return "--drain is longer than a resource handed to another replica can drain (--lease-renew-deadline minus --lease-retry): " +
			"when a replica joins and takes a resource over, the old holder stops renewing its lease and must stop acting by its renew deadline, " +
			"so in-flight messages it has not settled by then are fenced (left to the broker for the new holder, or counted as fenced) " +
			"instead of drained; SIGTERM is not affected. Set --drain at or under that, or lengthen the renew deadline",
		[]any{"drain", drain.String(), "usable", usable.String()}
}
