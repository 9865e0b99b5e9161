package bootstrap

import "log/slog"

// warnNarrowed says which files of a store were open to other users until
// now: whoever could read them may have read them, which the operator may
// want to know.
func warnNarrowed(log *slog.Logger, store string, files []string) {
	if len(files) > 0 {
		log.Warn(store+" files were readable by other users; narrowed to the owner (0600)", "files", files)
	}
}
