package placement

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
// Expiry is judged by every replica, as on Kubernetes, not left to etcd
// alone. A renewal writes the key again (same value, same etcd lease), so
// each one gives the key a new mod revision; a replica that has seen one
// mod revision of a key stay unchanged for the lease duration, measured on
// its own monotonic clock from the moment it first saw it, takes the
// holder for gone. It then deletes the key with a transaction that
// compares the mod revision with the one it saw, so that a renewal that
// lands first wins, and creates it anew as above. The etcd lease stays as
// a backstop: the key of a dead holder also goes when etcd expires it, and
// whichever comes first lets a standby in. etcd alone is not enough,
// because a new etcd leader gives every etcd lease its whole TTL again
// (lessor.Promote): a holder that died shortly before an election kept its
// key up to a lease duration longer.
//
// Why this is safe. A holder stops acting RenewDeadline after it sent its
// last renewal that succeeded, by its own monotonic clock (see [Timing]).
// The delete succeeds only if the key is still at the mod revision the
// replica saw, so that revision is the key's last write: the holder's last
// successful renewal or a later one whose answer it never got, either way
// sent no earlier than the send its deadline counts from. The write landed
// after it was sent, and the replica read its clock once the read that
// showed it had answered, so after it landed. So the delete lands more
// than LeaseDuration after the send, at least the margin LeaseDuration -
// RenewDeadline after the holder stopped, as long as the two clocks run at
// nearly the same rate (parts per million); only rates count, not offsets.
// A replica that has only just started waits a whole lease duration before
// taking a lease it finds held.
//
// A renewal is a keep-alive of the etcd lease and a transaction that puts
// the key again only if its create revision and lease are still this
// holding's: two requests, one of them a Raft write, which also proves
// that a quorum stands behind it. A standby's attempt is one read while
// the key is held, a transaction more when it has gone stale, and a grant
// and a transaction when it is free. Every renewal adds a revision to
// etcd's history: run etcd with automatic compaction.
type Etcd struct {
	client *clientv3.Client
	prefix string
	ttl    int64

	mu   sync.Mutex
	seen map[string]revisionSighting // by key
}

// revisionSighting is a key's mod revision and when this replica first
// saw it.
type revisionSighting struct {
	modRevision int64
	at          time.Time
}

// NewEtcd returns a backend on client keeping its keys under prefix (for
// example "/weida-connector/"), with leases of t.LeaseDuration. The caller
// owns client and closes it after every Holding has ended.
func NewEtcd(client *clientv3.Client, prefix string, t Timing) (*Etcd, error) {
	t, err := t.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Etcd{client: client, prefix: prefix, ttl: wholeSeconds(t.LeaseDuration), seen: make(map[string]revisionSighting)}, nil
}

// leaseDuration is the lease duration as etcd keeps it, whole seconds.
func (e *Etcd) leaseDuration() time.Duration { return time.Duration(e.ttl) * time.Second }

// stale records kv's mod revision as seen at now, unless this replica saw
// it earlier, and reports whether it has stayed unchanged for the lease
// duration since this replica first saw it. now must be read after the
// read that returned kv had its answer, so that it is later than the
// write of that revision.
//
// Only a key that has been written again since its creation (etcd's
// version above 1) is judged: that proves its holder renews by writing.
// Replicas of releases before this scheme renewed with a keep-alive and
// a read alone, so their keys never change; during a rolling upgrade
// from such a release, judging them would take every lease of the old
// replicas while they still act. Their keys are left to etcd's own
// expiry, as before; a new holding writes its key twice (see TryAcquire),
// so only a replica that dies between the two writes is.
func (e *Etcd) stale(kv *mvccpb.KeyValue, now time.Time) bool {
	if kv.Version < 2 {
		return false
	}
	key := string(kv.Key)
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.seen[key]
	switch {
	case ok && kv.ModRevision < s.modRevision:
		return false // a read that raced a later one: nothing new
	case !ok || kv.ModRevision > s.modRevision:
		e.seen[key] = revisionSighting{modRevision: kv.ModRevision, at: now}
		return false
	}
	return now.Sub(s.at) >= e.leaseDuration()
}

// forget drops the sighting of key, which is gone or was just deleted.
func (e *Etcd) forget(key string) {
	e.mu.Lock()
	delete(e.seen, key)
	e.mu.Unlock()
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
		held := &HeldError{Name: name, Holder: string(kv.Value), Epoch: uint64(kv.CreateRevision)}
		if !e.stale(kv, time.Now()) {
			return nil, held
		}
		// The holder has not renewed for a lease duration: delete its key,
		// unless a renewal or another replica has written it since.
		del, err := e.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(key)).
			Commit()
		if err != nil {
			return nil, fmt.Errorf("placement: etcd: deleting the expired lease %q: %w", name, err)
		}
		if !del.Succeeded {
			return nil, held
		}
	}
	e.forget(key)
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
	c := &etcdClaim{e: e, name: name, key: key, holder: holder, lease: grant.ID, epoch: txn.Header.Revision}
	// Write the key once more at once, so that it shows at version 2 that
	// its holder renews by writing (see stale) from the start, not only
	// from its first renewal a retry period later: a replica that dies in
	// between would otherwise be left to etcd's expiry, which an etcd
	// election lengthens by a lease. If this write fails, the first
	// renewal does it.
	_ = c.rewrite(ctx)
	return c, nil
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

// Holders implements Backend. It leaves out a key that this replica has
// seen unchanged for a lease duration: the replica that renewed it has
// stopped, whether or not etcd has deleted the key yet.
//
// It reads every key under the backend's prefix, whatever prefix asks for
// (one range of one key per resource and per replica), and records each
// key's mod revision. The Placer lists the members every round, so each
// replica watches, at no extra request, the resources it is not trying to
// take: when a dead replica drops out of the members and the survivors'
// share grows, its resources have gone unrenewed as long as its membership
// has, and can be taken in the same round rather than a lease duration
// later.
func (e *Etcd) Holders(ctx context.Context, prefix string) (map[string]string, error) {
	got, err := e.client.Get(ctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("placement: etcd: listing leases %q: %w", prefix, err)
	}
	now := time.Now()
	listed := make(map[string]bool, len(got.Kvs))
	holders := make(map[string]string)
	for _, kv := range got.Kvs {
		listed[string(kv.Key)] = true
		if e.stale(kv, now) {
			continue
		}
		if name := string(kv.Key[len(e.prefix):]); strings.HasPrefix(name, prefix) {
			holders[name] = string(kv.Value)
		}
	}
	// A key that is gone will have a new revision if it comes back.
	e.mu.Lock()
	for key := range e.seen {
		if !listed[key] {
			delete(e.seen, key)
		}
	}
	e.mu.Unlock()
	return holders, nil
}

type etcdClaim struct {
	e      *Etcd
	name   string
	key    string
	holder string
	lease  clientv3.LeaseID
	epoch  int64
}

func (c *etcdClaim) Epoch() uint64 { return uint64(c.epoch) }

// Renew keeps the etcd lease alive, the backstop that deletes the key if
// this replica dies, and writes the key again, which gives it the new mod
// revision by which the other replicas see that its holder lives. The
// write is a transaction that puts the key only if it is still this
// holding's (same create revision and lease): a key that an operator or
// a replica deleted, or that another acquisition created since, is lost.
// Being a write, it succeeds only while a quorum of members stands behind
// the leader, which a keep-alive alone does not prove on etcd 3.4.
func (c *etcdClaim) Renew(ctx context.Context) error {
	if _, err := c.e.client.KeepAliveOnce(ctx, c.lease); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("placement: etcd: lease %q expired: %w", c.name, ErrLost)
		}
		return fmt.Errorf("placement: etcd: renewing lease %q: %w", c.name, err)
	}
	return c.rewrite(ctx)
}

// rewrite puts the key again, the same value under the same etcd lease,
// only while it is still this holding's (same create revision and lease),
// which gives it a new mod revision for the other replicas to see.
func (c *etcdClaim) rewrite(ctx context.Context) error {
	txn, err := c.e.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(c.key), "=", c.epoch),
			clientv3.Compare(clientv3.LeaseValue(c.key), "=", c.lease)).
		Then(clientv3.OpPut(c.key, c.holder, clientv3.WithLease(c.lease))).
		Commit()
	if err != nil {
		return fmt.Errorf("placement: etcd: renewing lease %q: %w", c.name, err)
	}
	if !txn.Succeeded {
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
