package connlimit

import (
	"context"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DescriptorLimit is the process's RLIMIT_NOFILE soft limit (Go raises it to the hard limit at
// start), or 0 when it cannot be read.
func DescriptorLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}

// OpenDescriptors counts the process's open file descriptors (/proc/self/fd), or -1 where that
// cannot be read.
func OpenDescriptors() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer func() { _ = f.Close() }()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return -1
	}
	return len(names) - 1 // the directory being read
}

// Share is the connection cap a listener gets: frac of the descriptor limit, at most ceiling
// (and at least 16); ceiling alone when the limit is unknown.
func Share(frac float64, ceiling int) int {
	lim := DescriptorLimit()
	if lim == 0 {
		return ceiling
	}
	return max(16, min(ceiling, int(float64(lim)*frac)))
}

// WarnLevel is the fraction of the descriptor limit in use at which WatchDescriptors warns.
const WarnLevel = 0.8

// WatchDescriptors checks every interval how many descriptors the process holds and logs a
// warning when use reaches WarnLevel of the limit (once, until it falls below 70% again), and
// an info line when it has. The numbers are also the process collector's process_open_fds and
// process_max_fds metrics. It returns when ctx ends.
func WatchDescriptors(ctx context.Context, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	warned := false
	for {
		if lim, open := DescriptorLimit(), OpenDescriptors(); lim > 0 && open >= 0 {
			switch use := float64(open) / float64(lim); {
			case !warned && use >= WarnLevel:
				warned = true
				log.Warn("file descriptors nearly exhausted: new connections and files will fail at the limit", "open", open, "limit", lim)
			case warned && use < 0.7:
				warned = false
				log.Info("file descriptor use back to normal", "open", open, "limit", lim)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Collector exports each named listener's held, evicted and refused connections.
func Collector(listeners map[string]*Listener) prometheus.Collector {
	return &collector{ls: listeners}
}

var (
	descOpen    = prometheus.NewDesc("tether_listener_connections", "Connections the listener holds now.", []string{"listener"}, nil)
	descMax     = prometheus.NewDesc("tether_listener_max_connections", "The listener's connection cap.", []string{"listener"}, nil)
	descEvicted = prometheus.NewDesc("tether_listener_evicted_total", "Held connections closed to make room for a new one at the cap (idle, silent or slow ones).", []string{"listener"}, nil)
	descRefused = prometheus.NewDesc("tether_listener_refused_total", "Connections closed on arrival: the cap was reached and nothing was evictable.", []string{"listener"}, nil)
)

type collector struct{ ls map[string]*Listener }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descMax, descEvicted, descRefused} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for name, l := range c.ls {
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(l.Open()), name)
		ch <- prometheus.MustNewConstMetric(descMax, prometheus.GaugeValue, float64(l.Max()), name)
		ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(l.Evicted()), name)
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(l.Refused()), name)
	}
}
