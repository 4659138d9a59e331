#!/usr/bin/env bash
# Collects the data of make bench-curves into docs/perf/data/*.tsv (see main.go for the format)
# and draws them. Each point is one benchmark run on this machine; the notes say which machine,
# its load while the curve ran, and the baseline run beside it. Knobs (environment):
#   CURVES_SESSIONS   Decide walk sizes          (default "1000 10000 100000 1000000")
#   CURVES_MEMORY     live-session memory sizes  (default "10000 100000 1000000")
#   CURVES_CLIENTS    xDS fleet sizes            (default "1 10 100 1000"; 10000 takes minutes)
#   OLD_XDS           an older `go test -c ./pkg/xds` build: its fleet is drawn beside this one
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
data=docs/perf/data
mkdir -p "$data"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), Go $($GO env GOVERSION)"
load() { awk '{print $1" "$2" "$3}' /proc/loadavg; }
# metric FILE BENCH UNIT: the value before UNIT on BENCH's result line.
metric() { awk -v b="$2" -v u="$3" '$1 ~ "^Benchmark"b"(-[0-9]+)?$" { for (i = 2; i <= NF; i++) if ($i == u) print $(i-1) }' "$1" | tail -1; }

$GO test -c -o "$tmp/affinity.test" ./pkg/affinity/
$GO test -c -o "$tmp/xds.test" ./pkg/xds/

# Decide of an existing session and its two baselines over a shuffled walk of N sessions.
start=$(load)
{
	echo "# title: Decide, existing session, shuffled walk of N live sessions (CPU per request)"
	echo "# x: live sessions (N)"
	echo "# y: CPU ns per request"
	for n in ${CURVES_SESSIONS:-1000 10000 100000 1000000}; do
		TETHER_DECIDE_SESSIONS=$n "$tmp/affinity.test" -test.run '^$' -test.bench '^Benchmark(DecideExistingSession|BaselineMemdbFirst|BaselineMapAtomic)$' \
			-test.benchtime 200000x -test.benchmem -test.timeout 60m >"$tmp/decide-$n.txt"
		printf 'Decide (tether)\t%s\t%s\n' "$n" "$(metric "$tmp/decide-$n.txt" DecideExistingSession cpu-ns/op)"
		printf 'baseline: go-memdb First\t%s\t%s\n' "$n" "$(metric "$tmp/decide-$n.txt" BaselineMemdbFirst cpu-ns/op)"
		printf 'baseline: map + atomic add\t%s\t%s\n' "$n" "$(metric "$tmp/decide-$n.txt" BaselineMapAtomic cpu-ns/op)"
	done
	echo "# note: $machine; load average $start at start, $(load) at end."
	echo "# note: baselines in the same process run, same N, same 32-character ids, same shuffled walk."
} >"$data/decide-latency.tsv.new"
mv "$data/decide-latency.tsv.new" "$data/decide-latency.tsv"

# Heap per live session made through the engine.
start=$(load)
{
	echo "# title: Heap per live cookie session (made through the engine)"
	echo "# x: live sessions"
	echo "# y: heap bytes per session"
	sizes=${CURVES_MEMORY:-10000 100000 1000000}
	TETHER_LIVE_SESSIONS=${sizes// /,} "$tmp/affinity.test" -test.run '^$' -test.bench '^BenchmarkLiveSessionMemory$' -test.benchtime 1x -test.timeout 60m >"$tmp/memory.txt"
	for n in $sizes; do
		printf 'tether (memdb store)\t%s\t%s\n' "$n" "$(metric "$tmp/memory.txt" "LiveSessionMemory/$n" B/session)"
		printf 'goal: 400 B\t%s\t400\n' "$n"
	done
	echo "# note: $machine; load average $start at start, $(load) at end. 10M sessions: make bench-sessions-10m (not drawn here)."
} >"$data/session-memory.tsv.new"
mv "$data/session-memory.tsv.new" "$data/session-memory.tsv"

# xDS fleet: tether's CPU per connect and heap per client, 1,000 services x 10 instances.
start=$(load)
for b in "$tmp/xds.test" ${OLD_XDS:-}; do
	for n in ${CURVES_CLIENTS:-1 10 100 1000}; do
		TETHER_FLEET_CLIENTS=$n "$b" -test.run '^$' -test.bench '^BenchmarkXDSFleet$' -test.benchtime 3x -test.benchmem -test.timeout 60m >"$tmp/fleet-$(basename "$b")-$n.txt"
	done
done
for m in cpu-us/connect heap-KB/client; do
	case $m in
	cpu-us/connect) file=xds-connect-cpu title="xDS: tether CPU per ADS client connect (1,000 clusters, 10,000 endpoints)" y="tether CPU µs per connect" ;;
	heap-KB/client) file=xds-heap title="xDS: tether heap per connected ADS client (1,000 clusters, 10,000 endpoints)" y="KB of heap per client" ;;
	esac
	{
		echo "# title: $title"
		echo "# x: ADS clients (their own process)"
		echo "# y: $y"
		for b in "$tmp/xds.test" ${OLD_XDS:-}; do
			label="this build"
			[ "$b" = "$tmp/xds.test" ] || label="baseline: $(basename "$b")"
			for n in ${CURVES_CLIENTS:-1 10 100 1000}; do
				printf '%s\t%s\t%s\n' "$label" "$n" "$(metric "$tmp/fleet-$(basename "$b")-$n.txt" XDSFleet "$m")"
			done
		done
		echo "# note: $machine; load average $start at start, $(load) at end; the client process shares the cores."
		echo "# note: baseline: the build named in the legend (OLD_XDS), same fleet, same run."
	} >"$data/$file.tsv.new"
	mv "$data/$file.tsv.new" "$data/$file.tsv"
done

$GO run ./internal/benchcurves "$data"/*.tsv
ls -l docs/perf/*.svg
