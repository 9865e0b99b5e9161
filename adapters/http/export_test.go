package httpapi

// ConnCounts reports the listener's connections in total and from the
// network prefix key, and how many of key's are idle or new (closeable to
// make room): tests wait on it for the server's view of a connection.
func (s *Server) ConnCounts(key string) (total, fromKey, closeable int) {
	s.mu.Lock()
	lim := s.lim
	s.mu.Unlock()
	return lim.counts(key)
}
