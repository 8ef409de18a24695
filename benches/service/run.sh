#!/usr/bin/env bash
# examples/service.rs under a real load generator: both variants (the
# offloader's natural way and the naive Semaphore + spawn_blocking +
# timeout) at several offered loads, a few rounds each.
#
#   benches/service/run.sh                   # about 10 minutes on 2 cores
#   ROUNDS=1 SECONDS_PER_RUN=5 LOADS="0.5 3" benches/service/run.sh   # a quick look
#
# 1. Installs oha if missing (`cargo install oha --locked`). oha holds a
#    fixed request rate (-q) and writes every answered request with its
#    status and latency (--output-format csv), which is how the latency of
#    the 200s and of the 503s are told apart. wrk has neither (no fixed
#    rate, no per-request status), so it is not a fallback here.
# 2. Builds the example in release and calibrates the query once (about
#    20 ms alone on this machine); every server is started with that query.
# 3. Capacity: the offloader variant with a 10 s timeout under a closed loop
#    of 16 connections (four times the limit), 200s per second; measured at
#    the start (it sets the offered loads) and again at the end (drift).
# 4. Each round runs every load (LOADS, times the capacity) with each
#    variant (VARIANTS), rotating which variant goes first; a fresh server
#    per run. A variant is `offloader` or `naive`, with `+` options:
#    `+normal` (the threads that run SQLite keep the default scheduling
#    policy: --no-idle-db) and `+ohaup` (oha under nice -n -10: helps only
#    the load generator). E.g. VARIANTS="offloader offloader+normal".
#    oha: fixed rate, 1000 connections (enough that none waits for a free
#    one), --latency-correction (latency counted from when a request was
#    due, not when a connection was free), -w (requests in flight at the end
#    are waited for, so every request sent is counted).
# 5. During a run /stats is read twice a second (threads, RSS); after it, the
#    script waits up to 5 s for running queries to end and reads /stats once
#    more (most queries at once, started, finished, interrupted; peak RSS).
#    The machine's busy CPU time during the run, less the server's and
#    oha's, is what else ran: reported per run as "others' CPU". Each run
#    first waits (QUIET_WAIT seconds at most) for the machine to be quiet.
# 6. benches/service/report.py writes docs/perf/service-<date>.{json,md,svg}
#    (OUT overrides the prefix) and prints the table.
#
# Not under `cargo bench`: it needs a load generator, and ports.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
LOADS=${LOADS:-"0.5 1 1.5 2 3"}
VARIANTS=${VARIANTS:-"offloader naive"}
CAPACITY_SECONDS=${CAPACITY_SECONDS:-10}
TIMEOUT_MS=${TIMEOUT_MS:-100}
QUERY_MS=${QUERY_MS:-20}
CONNECTIONS=${CONNECTIONS:-1000}
QUIET_WAIT=${QUIET_WAIT:-15}
PORT=${PORT:-21000}
OUT=${OUT:-docs/perf/service-$(date -u +%F)}

began=$(date +%s)
TIMEFORMAT='%3U %3S' # `time`: oha's user and system CPU seconds
work=$(mktemp -d)
server=""
poller=""
cleanup() {
  [ -n "$poller" ] && kill "$poller" 2>/dev/null || true
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

oha=$(command -v oha || true)
if [ -z "$oha" ] && [ -x "$HOME/.cargo/bin/oha" ]; then oha="$HOME/.cargo/bin/oha"; fi
if [ -z "$oha" ]; then
  echo "installing oha (cargo install oha --locked)"
  cargo install oha --locked
  oha="$HOME/.cargo/bin/oha"
fi

cargo build --release --quiet --example service
bin=target/release/examples/service

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average before: $load_before"

# Starts the example on a port of its own: start VARIANT TIMEOUT_MS [ARGS...]
# Ports below the kernel's ephemeral range (oha's 1000 connections take
# ports from it); the next one if the port is taken all the same.
start() {
  local variant=$1 timeout=$2
  shift 2
  for _ in 1 2 3 4 5; do
    PORT=$((PORT + 1))
    local args=(--addr "127.0.0.1:$PORT" --timeout-ms "$timeout" "$@")
    local opt
    case "$variant" in naive*) args+=(--naive) ;; esac
    for opt in $(tr '+' ' ' <<<"${variant#*+}"); do
      [ "$opt" = "$variant" ] && break
      case "$opt" in
        normal) args+=(--no-idle-db) ;;
        ohaup) ;; # oha under nice -n -10 (below)
        *) echo "unknown variant option $opt in $variant" && exit 1 ;;
      esac
    done
    "$bin" "${args[@]}" >>"$work/server.log" 2>&1 &
    server=$!
    url="http://127.0.0.1:$PORT"
    for _ in $(seq 100); do
      curl -sf -m 1 "$url/stats" >/dev/null && return 0
      kill -0 "$server" 2>/dev/null || break
      sleep 0.1
    done
    stop
  done
  echo "the service did not start:"
  cat "$work/server.log"
  exit 1
}

stop() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=""
}

# Busy CPU ticks of the whole machine (user, nice, system, irq, softirq,
# steal) since boot: with the server's and oha's own CPU time it tells how
# much else ran during a run.
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }

# Before each run: waits until the machine is quiet (under 0.2 of a core
# busy over one second), QUIET_WAIT seconds at most, then goes on anyway:
# the report shows what else ran during each run.
waited=0
wait_quiet() {
  local b0 b1 n
  for n in $(seq "$QUIET_WAIT"); do
    b0=$(busy_ticks)
    sleep 1
    b1=$(busy_ticks)
    [ $((b1 - b0)) -lt 20 ] && return 0
    waited=$((waited + 1))
  done
  echo "  the machine is still busy ($((b1 - b0)) of 200 ticks in a second); going on"
}

# /stats twice a second into $1 until killed.
poll() {
  while :; do
    if s=$(curl -sf -m 2 "$url/stats"); then printf '%s\n' "$s" >>"$1"; fi
    sleep 0.5
  done
}

# Waits up to 5 s for the queries still running to end, then saves /stats.
final_stats() {
  local s
  for _ in $(seq 50); do
    s=$(curl -sf -m 2 "$url/stats" || true)
    case "$s" in *'"running": 0,'*) break ;; esac
    sleep 0.1
  done
  printf '%s\n' "$s" >"$1"
}

# Capacity: closed loop, long timeout. capacity NAME
capacity() {
  wait_quiet
  start offloader 10000 --rows "$rows"
  local cmd=("$oha" --no-tui -z "${CAPACITY_SECONDS}s" -c 16 -w --output-format csv
    -o "$work/$1.csv" "$url/q")
  printf '%s\n' "${cmd[*]}" >"$work/$1.cmd"
  "${cmd[@]}"
  final_stats "$work/$1.final.json"
  stop
}

# The query, calibrated once by a server of the default variant.
start offloader "$TIMEOUT_MS" --query-ms "$QUERY_MS"
rows=$(curl -sf "$url/stats" | sed -n 's/.*"rows": \([0-9]*\).*/\1/p')
stop
echo "query: $rows rows (about $QUERY_MS ms alone)"

capacity capacity-start
cap=$(python3 benches/service/report.py --capacity "$work/capacity-start.csv" "$CAPACITY_SECONDS")
echo "capacity: $cap requests/s answered 200 (offloader, closed loop of 16, timeout 10 s)"

printf 'variant\tfactor\trate\tround\tname\n' >"$work/runs.tsv"
for round in $(seq "$ROUNDS"); do
  # Rotated by one per round: each variant goes first in turn.
  read -ra vs <<<"$VARIANTS"
  k=$(((round - 1) % ${#vs[@]}))
  variants="${vs[*]:k} ${vs[*]:0:k}"
  for factor in $LOADS; do
    rate=$(python3 -c "print(max(1, round($factor * $cap)))")
    for variant in $variants; do
      name="$variant-$factor-r$round"
      wait_quiet
      echo "round $round: $variant at ${factor}x = $rate requests/s for ${SECONDS_PER_RUN}s"
      start "$variant" "$TIMEOUT_MS" --rows "$rows"
      poll "$work/$name.polls.jsonl" &
      poller=$!
      cmd=("$oha" --no-tui -z "${SECONDS_PER_RUN}s" -q "$rate" -c "$CONNECTIONS"
        --latency-correction -w --output-format csv -o "$work/$name.csv" "$url/q")
      case "$variant" in *+ohaup*) cmd=(nice -n -10 "${cmd[@]}") ;; esac
      printf '%s\n' "${cmd[*]}" >"$work/$name.cmd"
      cpu_before=$(busy_ticks)
      wall_before=$(date +%s.%N)
      { time "${cmd[@]}" 2>>"$work/oha.log"; } 2>"$work/$name.oha-cpu"
      # wall s, every CPU's busy ticks, the server's ticks, oha's CPU s
      printf '%s %s %s %s\n' "$(awk "BEGIN { print $(date +%s.%N) - $wall_before }")" \
        "$(($(busy_ticks) - cpu_before))" "$(awk '{print $14 + $15}' "/proc/$server/stat")" \
        "$(awk '{print $1 + $2}' "$work/$name.oha-cpu")" >"$work/$name.cpu"
      kill "$poller" 2>/dev/null || true
      wait "$poller" 2>/dev/null || true
      poller=""
      final_stats "$work/$name.final.json"
      stop
      printf '%s\t%s\t%s\t%s\t%s\n' "$variant" "$factor" "$rate" "$round" "$name" >>"$work/runs.tsv"
    done
  done
done

capacity capacity-end

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cat >"$work/meta.json" <<EOF
{
  "date": "$(date -u +%FT%TZ)",
  "commit": "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples Cargo.toml || echo '+dirty')",
  "cpu": "$(lscpu | sed -n 's/^Model name: *//p' | head -1)",
  "vcpus": $(nproc),
  "kernel": "$(uname -r)",
  "rustc": "$(rustc -V)",
  "oha": "$("$oha" --version)",
  "load_before": "$load_before",
  "load_after": "$load_after",
  "rows": $rows,
  "query_ms": $QUERY_MS,
  "timeout_ms": $TIMEOUT_MS,
  "limit": 4,
  "rounds": $ROUNDS,
  "seconds_per_run": $SECONDS_PER_RUN,
  "capacity_seconds": $CAPACITY_SECONDS,
  "connections": $CONNECTIONS,
  "variants": "$VARIANTS",
  "quiet_waited_seconds": $waited,
  "wall_seconds": $(($(date +%s) - began))
}
EOF
python3 benches/service/report.py --report "$work" "$OUT"
