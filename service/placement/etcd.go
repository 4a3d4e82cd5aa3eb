package placement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Etcd keeps leases in an etcd cluster: the lease called name is the key
// Prefix+name, whose value is the holder's identity, attached to an etcd
// lease with a TTL of LeaseDuration (rounded up to whole seconds). A key
// is created only where none exists (a transaction comparing its create
// revision with 0), so the epoch of a holding is the key's create
// revision: etcd's revision counter never goes back, so every later
// acquisition has a larger one.
//
// A renewal is a keep-alive of the etcd lease followed by a linearizable
// read of the key, which succeeds only while a quorum of members answers
// and the key is still this holding's (same create revision and lease):
// two requests per renewal. A standby's attempt is one read while the key
// exists, and a grant and a transaction when it is free.
type Etcd struct {
	client *clientv3.Client
	prefix string
	ttl    int64
}

// NewEtcd returns a backend on client keeping its keys under prefix (for
// example "/weida-connector/"), with leases of t.LeaseDuration. The caller
// owns client and closes it after every Holding has ended.
func NewEtcd(client *clientv3.Client, prefix string, t Timing) (*Etcd, error) {
	t, err := t.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Etcd{client: client, prefix: prefix, ttl: wholeSeconds(t.LeaseDuration)}, nil
}

// TryAcquire implements Backend.
func (e *Etcd) TryAcquire(ctx context.Context, name, holder string) (Claim, error) {
	key := e.prefix + name
	got, err := e.client.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("placement: etcd: reading lease %q: %w", name, err)
	}
	if len(got.Kvs) > 0 {
		kv := got.Kvs[0]
		return nil, &HeldError{Name: name, Holder: string(kv.Value), Epoch: uint64(kv.CreateRevision)}
	}
	grant, err := e.client.Grant(ctx, e.ttl)
	if err != nil {
		return nil, fmt.Errorf("placement: etcd: granting a lease for %q: %w", name, err)
	}
	txn, err := e.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, holder, clientv3.WithLease(grant.ID))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil || !txn.Succeeded {
		// The grant is of no use: revoke it rather than let it expire,
		// but wait no longer than the lease would live anyway.
		revoke, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(e.ttl)*time.Second)
		_, _ = e.client.Revoke(revoke, grant.ID)
		cancel()
	}
	if err != nil {
		return nil, fmt.Errorf("placement: etcd: creating lease %q: %w", name, err)
	}
	if !txn.Succeeded {
		held := &HeldError{Name: name}
		if r := txn.Responses[0].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
			held.Holder, held.Epoch = string(r.Kvs[0].Value), uint64(r.Kvs[0].CreateRevision)
		}
		return nil, held
	}
	// The put is the transaction's only write, so the key's create
	// revision is the transaction's revision.
	return &etcdClaim{e: e, name: name, key: key, lease: grant.ID, epoch: txn.Header.Revision}, nil
}

// Holder implements Backend.
func (e *Etcd) Holder(ctx context.Context, name string) (string, uint64, error) {
	got, err := e.client.Get(ctx, e.prefix+name)
	if err != nil {
		return "", 0, fmt.Errorf("placement: etcd: reading lease %q: %w", name, err)
	}
	if len(got.Kvs) == 0 {
		return "", 0, nil
	}
	return string(got.Kvs[0].Value), uint64(got.Kvs[0].CreateRevision), nil
}

// Holders implements Backend.
func (e *Etcd) Holders(ctx context.Context, prefix string) (map[string]string, error) {
	got, err := e.client.Get(ctx, e.prefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("placement: etcd: listing leases %q: %w", prefix, err)
	}
	holders := make(map[string]string, len(got.Kvs))
	for _, kv := range got.Kvs {
		holders[string(kv.Key[len(e.prefix):])] = string(kv.Value)
	}
	return holders, nil
}

type etcdClaim struct {
	e     *Etcd
	name  string
	key   string
	lease clientv3.LeaseID
	epoch int64
}

func (c *etcdClaim) Epoch() uint64 { return uint64(c.epoch) }

func (c *etcdClaim) Renew(ctx context.Context) error {
	if _, err := c.e.client.KeepAliveOnce(ctx, c.lease); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("placement: etcd: lease %q expired: %w", c.name, ErrLost)
		}
		return fmt.Errorf("placement: etcd: renewing lease %q: %w", c.name, err)
	}
	// The keep-alive alone does not prove the key is still ours (an
	// operator may have deleted it), nor, on etcd 3.4, that a quorum
	// stands behind the member that answered; a linearizable read does.
	got, err := c.e.client.Get(ctx, c.key)
	if err != nil {
		return fmt.Errorf("placement: etcd: confirming lease %q: %w", c.name, err)
	}
	if len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != c.epoch || clientv3.LeaseID(got.Kvs[0].Lease) != c.lease {
		return fmt.Errorf("placement: etcd: lease %q is no longer this holder's: %w", c.name, ErrLost)
	}
	return nil
}

// Release revokes the etcd lease, which deletes the key with it; a lease
// that has expired already is gone, which is what Release wants.
func (c *etcdClaim) Release(ctx context.Context) error {
	if _, err := c.e.client.Revoke(ctx, c.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("placement: etcd: releasing lease %q: %w", c.name, err)
	}
	return nil
}
