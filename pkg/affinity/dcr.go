package affinity

import (
	"maps"
	"slices"

	"github.com/tether-dev/tether/pkg/dcr"
)

// rules returns the DCR rules of a hash service and whether it has a DCR file at all. A file
// that could not be loaded yet yields nil rules (default keys) until Run loads it.
func (e *Engine) rules(st *svcState) (*dcr.Rules, bool) {
	if st.svc.DCRFile == "" {
		return nil, false
	}
	if w := st.dcr.Load(); w != nil {
		return w.Rules(), true
	}
	return nil, true
}

// dcrWatcherLocked returns the watcher of a DCR file, loading it the first time; nil when it
// cannot be loaded (logged; Run retries). e.mu must be held.
func (e *Engine) dcrWatcherLocked(path string) *dcr.Watcher {
	if w, ok := e.dcr[path]; ok {
		return w
	}
	w, err := dcr.NewWatcher(path, dcr.WithLogger(e.log))
	if err != nil {
		if msg := err.Error(); e.dcrFailed[path] != msg { // log each new failure once
			e.dcrFailed[path] = msg
			e.log.Error("affinity: loading DCR file; using default keys until it loads", "path", path, "err", err)
		}
		return nil
	}
	if _, failed := e.dcrFailed[path]; failed {
		delete(e.dcrFailed, path)
		e.log.Info("affinity: DCR file loaded", "path", path)
	}
	e.dcr[path] = w
	return w
}

// reloadDCR re-reads changed DCR files and retries files that failed to load.
func (e *Engine) reloadDCR() {
	v := e.view.Load()
	e.mu.Lock()
	for _, st := range v.services {
		if st.svc.DCRFile != "" && st.dcr.Load() == nil {
			if w := e.dcrWatcherLocked(st.svc.DCRFile); w != nil {
				st.dcr.Store(w)
			}
		}
	}
	watchers := slices.Collect(maps.Values(e.dcr))
	e.mu.Unlock()
	for _, w := range watchers {
		_, _ = w.Reload() // failures are logged by the watcher; the previous rules stay
	}
}
