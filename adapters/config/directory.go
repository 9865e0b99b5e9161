package config

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"iop/domain"
	"iop/ports"
)

var _ ports.NodeDirectory = (*Directory)(nil)

// Directory is the edge's node directory: an immutable snapshot of records
// that Replace swaps atomically on config reload. It is safe for concurrent
// use, and nothing it returns or prints contains a token except the Token
// field of the records it hands out.
type Directory struct {
	snap atomic.Pointer[dirSnapshot]
}

type dirSnapshot struct {
	records []domain.NodeRecord
	// digests[i] is sha256 of records[i].Token (or records[i].TokenSHA256
	// decoded), so every comparison in Authenticate has the same length and
	// the token's length does not leak.
	digests [][sha256.Size]byte
	// usable[i] is 1 unless records[i] has neither a token nor a valid
	// digest: such a record never authenticates, even against an empty token.
	usable []int
	byID   map[string]int
}

// NewDirectory returns a directory holding a deep copy of records.
func NewDirectory(records []domain.NodeRecord) *Directory {
	d := &Directory{}
	d.Replace(records)
	return d
}

// Replace swaps in a deep copy of records; calls in flight finish on the old set.
func (d *Directory) Replace(records []domain.NodeRecord) {
	s := &dirSnapshot{
		records: make([]domain.NodeRecord, len(records)),
		digests: make([][sha256.Size]byte, len(records)),
		usable:  make([]int, len(records)),
		byID:    make(map[string]int, len(records)),
	}
	for i, r := range records {
		s.records[i] = cloneRecord(r)
		// The same digest reload compares tokens by (NodeRecord.SameToken).
		if d, ok := r.TokenDigest(); ok {
			s.digests[i] = d
			s.usable[i] = 1
		}
		if _, dup := s.byID[r.ID]; !dup {
			s.byID[r.ID] = i
		}
	}
	d.snap.Store(s)
}

// Authenticate returns a copy of the record whose token equals token. Every
// record is compared, in constant time and without stopping at a match, so
// neither timing nor order reveals which record matched. Records with an
// empty token never match. The error wraps domain.ErrUnknownToken.
func (d *Directory) Authenticate(token string) (domain.NodeRecord, error) {
	if token == "" {
		return domain.NodeRecord{}, fmt.Errorf("authenticate node: empty token: %w", domain.ErrUnknownToken)
	}
	s := d.snap.Load()
	want := sha256.Sum256([]byte(token))
	match := -1
	for i := range s.digests {
		eq := subtle.ConstantTimeCompare(want[:], s.digests[i][:]) & s.usable[i]
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return domain.NodeRecord{}, fmt.Errorf("authenticate node: %w", domain.ErrUnknownToken)
	}
	return cloneRecord(s.records[match]), nil
}

// Lookup returns a copy of the record with the given id.
func (d *Directory) Lookup(id string) (domain.NodeRecord, bool) {
	s := d.snap.Load()
	i, ok := s.byID[id]
	if !ok {
		return domain.NodeRecord{}, false
	}
	return cloneRecord(s.records[i]), true
}

// Records returns a deep copy of every record, in config order.
func (d *Directory) Records() []domain.NodeRecord {
	s := d.snap.Load()
	out := make([]domain.NodeRecord, len(s.records))
	for i, r := range s.records {
		out[i] = cloneRecord(r)
	}
	return out
}

// String lists the node ids and never the tokens.
func (d *Directory) String() string {
	s := d.snap.Load()
	ids := make([]string, len(s.records))
	for i, r := range s.records {
		ids[i] = r.ID
	}
	return fmt.Sprintf("Directory%q", ids)
}

// cloneRecord copies r so that no slice or map is shared with the directory.
func cloneRecord(r domain.NodeRecord) domain.NodeRecord {
	out := domain.NodeRecord{ID: r.ID, Token: r.Token, TokenSHA256: r.TokenSHA256}
	if r.Adapters != nil {
		out.Adapters = make([]domain.AdapterConfig, len(r.Adapters))
		for i, a := range r.Adapters {
			a.Models = slices.Clone(a.Models)
			a.Args = slices.Clone(a.Args)
			a.Env = maps.Clone(a.Env)
			a.InheritEnv = slices.Clone(a.InheritEnv)
			if a.Targets != nil {
				targets := make(map[string]domain.ExecTarget, len(a.Targets))
				for name, t := range a.Targets {
					t.Command = slices.Clone(t.Command)
					t.Env = maps.Clone(t.Env)
					t.InheritEnv = slices.Clone(t.InheritEnv)
					targets[name] = t
				}
				a.Targets = targets
			}
			out.Adapters[i] = a
		}
	}
	if r.Providers != nil {
		out.Providers = make([]domain.ProviderConfig, len(r.Providers))
		for i, p := range r.Providers {
			p.Models = slices.Clone(p.Models)
			out.Providers[i] = p
		}
	}
	return out
}
