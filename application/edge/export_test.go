package edge

import "iop/ports"

// OrphanAdd remembers run on node as a lost background run that went out
// on link would (tests).
func OrphanAdd(o *OrphanCancels, node, run string, link ports.NodeLink) { o.add(node, run, link) }
