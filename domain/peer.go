package domain

import "slices"

// CodeIdentityMismatch rejects a node whose client certificate names
// another node than the one its token belongs to.
const CodeIdentityMismatch = "identity_mismatch"

// PeerIdentity is what the edge's transport established about a node's
// connection before the node registered.
type PeerIdentity struct {
	// Encrypted is true on a TLS link.
	Encrypted bool
	// CertNames are the common name and DNS names of the client
	// certificate the edge verified against its client CA; nil without one.
	CertNames []string
}

// Names reports whether the verified client certificate names nodeID.
func (p PeerIdentity) Names(nodeID string) bool {
	return nodeID != "" && slices.Contains(p.CertNames, nodeID)
}
