package dcr

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Watcher keeps the current Rules of one file, reloading it when its modification time or
// size changes. A reload affects only the requests that ask for Rules afterwards: callers take
// Rules() once per initial request. A file that fails to load or parse on reload leaves the
// previous rules in place and is logged; it is tried again once it changes.
//
// Rules and Reload are safe for concurrent use; Run is called at most once.
type Watcher struct {
	path     string
	interval time.Duration
	log      *slog.Logger
	onReload func(*Rules, error)

	cur atomic.Pointer[Rules]

	mu   sync.Mutex // serializes reloads and guards stat
	stat fileStamp
}

// fileStamp identifies one version of a file well enough for polling.
type fileStamp struct {
	mod  time.Time
	size int64
}

// WatcherOption configures a Watcher.
type WatcherOption func(*Watcher)

// WithInterval sets how often Run polls the file (default 2s; values ≤ 0 keep the default).
func WithInterval(d time.Duration) WatcherOption {
	return func(w *Watcher) {
		if d > 0 {
			w.interval = d
		}
	}
}

// WithLogger sets the logger for reloads and reload failures; the default discards.
func WithLogger(l *slog.Logger) WatcherOption {
	return func(w *Watcher) {
		if l != nil {
			w.log = l
		}
	}
}

// WithOnReload registers fn, called after every reload attempt that found a changed file: with
// the new rules and nil, or with nil and the error (the previous rules stay current). fn runs
// on the reloading goroutine and must not block.
func WithOnReload(fn func(*Rules, error)) WatcherOption {
	return func(w *Watcher) { w.onReload = fn }
}

// NewWatcher loads path and returns a Watcher holding its rules. It fails when the first load
// fails: a service must not start with rules it cannot read.
func NewWatcher(path string, opts ...WatcherOption) (*Watcher, error) {
	w := &Watcher{path: path, interval: 2 * time.Second, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(w)
	}
	st, err := stamp(path)
	if err != nil {
		return nil, fmt.Errorf("dcr: %w", err)
	}
	r, err := Load(path)
	if err != nil {
		return nil, err
	}
	w.stat = st
	w.cur.Store(r)
	return w, nil
}

// Rules returns the current rules; never nil.
func (w *Watcher) Rules() *Rules { return w.cur.Load() }

// Path returns the watched file's path.
func (w *Watcher) Path() string { return w.path }

// Run polls the file every interval until ctx ends, then returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = w.Reload()
		}
	}
}

// Reload checks the file now. It returns whether new rules were installed, and the error of a
// failed attempt (the previous rules stay current). An unchanged file is not re-read.
func (w *Watcher) Reload() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := stamp(w.path)
	if err != nil {
		// Keep the last stamp so the file is reloaded once it is back, even unchanged.
		if !w.stat.equal(fileStamp{}) {
			w.log.Warn("DCR file unreadable; keeping previous rules", "path", w.path, "err", err)
			w.stat = fileStamp{}
			w.notify(nil, err)
		}
		return false, fmt.Errorf("dcr: %w", err)
	}
	if st.equal(w.stat) {
		return false, nil
	}
	w.stat = st
	r, err := Load(w.path)
	if err != nil {
		w.log.Warn("DCR file invalid; keeping previous rules", "path", w.path, "err", err)
		w.notify(nil, err)
		return false, err
	}
	w.cur.Store(r)
	w.log.Info("DCR file reloaded", "path", w.path, "sipRules", len(r.sip), "httpRules", len(r.http))
	w.notify(r, nil)
	return true, nil
}

func (w *Watcher) notify(r *Rules, err error) {
	if w.onReload != nil {
		w.onReload(r, err)
	}
}

func (a fileStamp) equal(b fileStamp) bool { return a.mod.Equal(b.mod) && a.size == b.size }

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}
