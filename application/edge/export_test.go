package edge

// OrphanAdd remembers run on node as a lost background run would (tests).
func OrphanAdd(o *OrphanCancels, node, run string) { o.add(node, run) }
