// Package extprocbench is tether's cross-process ext_proc benchmark (make bench-extproc): it
// builds the tether binary and a null ext_proc binary (nullproc), runs each as its own process
// on loopback, and drives both with the same client in alternating rounds, as Envoy would:
// one gRPC stream per HTTP exchange — request_headers with an existing session's cookie →
// answer, response_headers → answer, half-close → end of stream. It reports, for both servers,
// exchanges per second, p50 and p99 latency of a whole exchange, and the server's CPU per
// exchange (utime + stime from /proc/<pid>/stat), and the ratios tether / null with their
// spread over the rounds, at concurrency 1, 16 and 64. The null server runs on tether's gRPC
// server options (extproc.ServerOptions), so the ratios measure tether's work per exchange; see
// BenchmarkCrossProcess for profiling and for trying other server options side by side.
package extprocbench
