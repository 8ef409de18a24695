#!/usr/bin/env python3
"""Figures, table and plot of a benches/service/run.sh run (standard library only).

  report.py --capacity CSV SECONDS    prints 200s per second of one oha CSV
  report.py --report WORKDIR PREFIX   writes PREFIX.json, PREFIX.md, PREFIX.svg

Latency per status comes from oha's per-request CSV (--output-format csv:
one line per answered request with its status and its duration, which
--latency-correction counts from when the request was due). Percentiles are
nearest-rank over those lines. Requests oha sent and got no answer for
(connection errors) are not in the CSV; they show as `no answer`, the
requests due at the fixed rate less those answered.
"""

import csv
import json
import math
import os
import re
import statistics
import sys

VARIANTS = ["offloader", "naive"]  # order of the table; others follow as first seen
COLOURS = {"offloader": "#1f77b4", "naive": "#d62728"}
MORE_COLOURS = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
RUNTIME_WORKERS = 2  # #[tokio::main] on 2 vCPUs


def read_csv(path):
    """[(status, duration in ms)] of every answered request."""
    with open(path, newline="") as f:
        return [
            (int(row["status"]), float(row["request-duration"]) * 1e3)
            for row in csv.DictReader(f)
        ]


def percentile(values, p):
    """Nearest-rank percentile, None for no values."""
    if not values:
        return None
    values = sorted(values)
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


def count_200_per_second(path, seconds):
    return sum(1 for status, _ in read_csv(path) if status == 200) / seconds


def command(work, name):
    """The oha command of a run, its output file under $WORK."""
    with open(os.path.join(work, name + ".cmd")) as f:
        words = f.read().strip().replace(work.rstrip("/"), "$WORK").split(" ")
    if words[0].endswith("/oha"):
        words[0] = "oha"
    return " ".join(words)


def pool_metrics(debug):
    """The integer fields of the pool's `Metrics` Debug text."""
    if not debug:
        return None
    return {k: int(v) for k, v in re.findall(r"(\w+): (\d+)(?=[,}\s])", debug)}


def figures(work, run, meta):
    name, rate, seconds = run["name"], run["rate"], meta["seconds_per_run"]
    answers = read_csv(os.path.join(work, name + ".csv"))
    with open(os.path.join(work, name + ".final.json")) as f:
        final = json.loads(f.read() or "{}")
    polls = []
    with open(os.path.join(work, name + ".polls.jsonl")) as f:
        for line in f:
            try:
                polls.append(json.loads(line))
            except ValueError:
                pass
    # What else ran: the machine's busy CPU during the run less the
    # server's and oha's, in cores (CLK_TCK 100).
    with open(os.path.join(work, name + ".cpu")) as f:
        wall, busy_ticks, server_ticks, oha_cpu = (float(v) for v in f.read().split())
    others = max(0.0, (busy_ticks - server_ticks) / 100 - oha_cpu) / wall
    ok = [ms for status, ms in answers if status == 200]
    busy = [ms for status, ms in answers if status == 503]
    due = round(rate * seconds)
    started = final.get("started", 0)
    threads = [p["threads"] for p in polls] + [final.get("threads", 0)]
    return {
        "variant": run["variant"],
        "factor": run["factor"],
        "round": run["round"],
        "rate": rate,
        "answered": len(answers),
        "no_answer": max(0, due - len(answers)),
        "ok": len(ok),
        "busy": len(busy),
        "other": len(answers) - len(ok) - len(busy),
        "goodput": len(ok) / seconds,
        "busy_pct": 100 * len(busy) / len(answers) if answers else None,
        "ok_p50_ms": percentile(ok, 50),
        "ok_p99_ms": percentile(ok, 99),
        "ok_p999_ms": percentile(ok, 99.9),
        "busy_p99_ms": percentile(busy, 99),
        "max_in_flight": final.get("max_running"),
        "threads_max": max(threads),
        "rss_peak_mb": final.get("rss_peak_kb", 0) / 1024,
        "started": started,
        "finished": final.get("finished"),
        "interrupted": final.get("interrupted"),
        "stopped_before_query": final.get("stopped_before_query"),
        "still_running": final.get("running"),
        "useful_pct": 100 * len(ok) / started if started else None,
        # The handler's own time of its 503s, per cause: [count, p50, p99, max] ms.
        "handler_503": final.get("handler_503_ms"),
        "refused": (final.get("handler_503_ms") or {}).get("refused", [None])[0],
        "refused_handler_p99_ms": (final.get("handler_503_ms") or {}).get("refused", [0, 0, None])[2],
        "shed_503": (final.get("handler_503_ms") or {}).get("shed", [None])[0],
        "timeout_503": (final.get("handler_503_ms") or {}).get("timeout", [None])[0],
        # The 503s' p99 less the slowest (shed + timed out) ones: about the
        # p99 of the refusals at admission as oha saw them.
        "busy_fast_p99_ms": percentile(
            sorted(busy)[: max(0, len(busy) - sum(
                ((final.get("handler_503_ms") or {}).get(c, [0])[0] for c in ("shed", "timeout", "other"))))],
            99),
        "pool": pool_metrics(final.get("pool")),
        "server_cores": server_ticks / 100 / wall,
        "oha_cores": oha_cpu / wall,
        "others_cores": others,
        "command": command(work, name),
    }


NUMERIC = [
    "rate", "goodput", "busy_pct", "ok_p50_ms", "ok_p99_ms", "ok_p999_ms",
    "busy_p99_ms", "max_in_flight", "threads_max", "rss_peak_mb", "started",
    "finished", "interrupted", "useful_pct", "no_answer", "other",
    "server_cores", "oha_cores", "others_cores",
    "refused", "refused_handler_p99_ms", "shed_503", "timeout_503", "busy_fast_p99_ms",
]


def summarize(runs):
    """Median, min and max over rounds, per variant and load."""
    groups = {}
    for r in runs:
        groups.setdefault((r["variant"], r["factor"]), []).append(r)
    out = []
    for r in runs:
        if r["variant"] not in VARIANTS:
            VARIANTS.append(r["variant"])
    for (variant, factor), rs in sorted(groups.items(), key=lambda g: (VARIANTS.index(g[0][0]), float(g[0][1]))):
        row = {"variant": variant, "factor": factor, "rounds": len(rs)}
        for key in NUMERIC:
            values = [r[key] for r in rs if r[key] is not None]
            row[key] = {
                "median": statistics.median(values) if values else None,
                "min": min(values) if values else None,
                "max": max(values) if values else None,
            }
        out.append(row)
    return out


def fmt(v, digits=0):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def markdown(head, rows):
    """A markdown table: the header line, its rule, the rows."""
    rule = "|" + " --- |" * head.count(" | ") + " --- |"
    return "\n".join([head, rule, *rows])


def verdict(passed):
    return "n/a" if passed is None else "PASS" if passed else "FAIL"


def table(summary):
    head = (
        "| variant | load | offered /s | goodput /s (min–max) | 503 % | 200 p50 ms | 200 p99 ms "
        "| 200 p99.9 ms | 503 p99 ms | max in flight | threads | RSS MB | started | interrupted "
        "| 200s / started | others' CPU |"
    )
    lines = []
    for row in summary:
        m = {k: row[k]["median"] for k in NUMERIC}
        g = row["goodput"]
        lines.append(
            f"| {row['variant']} | {row['factor']}× | {fmt(m['rate'])} "
            f"| {fmt(g['median'], 1)} ({fmt(g['min'], 1)}–{fmt(g['max'], 1)}) "
            f"| {fmt(m['busy_pct'], 1)} | {fmt(m['ok_p50_ms'], 1)} | {fmt(m['ok_p99_ms'], 1)} "
            f"| {fmt(m['ok_p999_ms'], 1)} | {fmt(m['busy_p99_ms'], 1)} | {fmt(m['max_in_flight'])} "
            f"| {fmt(m['threads_max'])} | {fmt(m['rss_peak_mb'], 1)} | {fmt(m['started'])} "
            f"| {fmt(m['interrupted'])} | {fmt(m['useful_pct'], 1)} % | {fmt(row['others_cores']['max'], 2)} |"
        )
    return markdown(head, lines)


def rounds_table(runs):
    """Every run, with the handler's own time of its refusals."""
    head = (
        "| variant | load | round | goodput /s | 200s / started | 503 % | 200 p50 ms | 200 p99 ms "
        "| 503 p99 ms | 503 p99 less shed and timed out ms | refused (handler p99 ms) | shed | timed out "
        "| server / oha / others' cores |"
    )
    lines = []
    key = lambda r: (VARIANTS.index(r["variant"]), float(r["factor"]), r["round"])
    for r in sorted(runs, key=key):
        lines.append(
            f"| {r['variant']} | {r['factor']}× | {r['round']} | {fmt(r['goodput'], 1)} "
            f"| {fmt(r['useful_pct'], 1)} % | {fmt(r['busy_pct'], 1)} | {fmt(r['ok_p50_ms'], 1)} "
            f"| {fmt(r['ok_p99_ms'], 1)} | {fmt(r['busy_p99_ms'], 1)} | {fmt(r['busy_fast_p99_ms'], 1)} "
            f"| {fmt(r['refused'])} ({fmt(r['refused_handler_p99_ms'], 3)}) | {fmt(r['shed_503'])} "
            f"| {fmt(r['timeout_503'])} | {fmt(r['server_cores'], 2)} / {fmt(r['oha_cores'], 2)} "
            f"/ {fmt(r['others_cores'], 2)} |"
        )
    return markdown(head, lines)


def targets(runs, capacity, meta):
    """Issue 32's targets, on the medians and per round."""
    factors = sorted({float(r["factor"]) for r in runs})
    high, low = max(factors), min(factors)

    def pick(variant, factor):
        return [r for r in runs if r["variant"] == variant and float(r["factor"]) == factor]

    def med(rs, key):
        vals = [r[key] for r in rs if r[key] is not None]
        return statistics.median(vals) if vals else None

    hi, lo, lo_naive = pick("offloader", high), pick("offloader", low), pick("naive", low)
    limit, timeout = meta["limit"], meta["timeout_ms"]
    naive_p99 = med(lo_naive, "ok_p99_ms")
    checks = [
        (f"{high}×: of the queries that start, ≥ 95 % end as a 200", "useful_pct", hi, lambda v: v >= 95),
        (f"{high}×: goodput ≥ 80 % of the capacity ({capacity:.1f}/s)", "goodput", hi, lambda v: v >= 0.8 * capacity),
        (f"{high}×: p99 of 200s ≤ the timeout ({timeout} ms)", "ok_p99_ms", hi, lambda v: v <= timeout),
        (f"{high}×: p99 of 503s ≤ 5 ms", "busy_p99_ms", hi, lambda v: v <= 5),
        (f"{high}×: exactly the limit ({limit}) in flight", "max_in_flight", hi, lambda v: v == limit),
        (f"{high}×: threads ≤ limit + runtime workers + 3 = {limit + RUNTIME_WORKERS + 3}",
         "threads_max", hi, lambda v: v <= limit + RUNTIME_WORKERS + 3),
        (f"{low}×: 0 % 503", "busy_pct", lo, lambda v: v == 0),
        (f"{low}×: p99 of 200s within 1.2× the naive variant's ({fmt(naive_p99, 1)} ms)",
         "ok_p99_ms", lo, lambda v: naive_p99 is not None and v <= 1.2 * naive_p99),
    ]
    out = []
    for text, key, rs, ok in checks:
        median = med(rs, key)
        held = sum(1 for r in rs if r[key] is not None and ok(r[key]))
        out.append({
            "target": text,
            "median": median,
            # None: nothing to judge (no 503s at all, say).
            "pass": None if median is None else ok(median),
            "rounds_held": held,
            "rounds": len(rs),
            "per_round": [r[key] for r in rs],
        })
    return out


def svg(summary, capacity, meta):
    w, h = 800, 470
    left, right, top, bottom = 70, 215, 50, 60
    pw, ph = w - left - right, h - top - bottom
    xmax = max(row["rate"]["median"] for row in summary) * 1.08
    ymax = max([capacity] + [row["goodput"]["max"] for row in summary]) * 1.2

    def x(v):
        return left + pw * v / xmax

    def y(v):
        return top + ph * (1 - v / ymax)

    def ticks(top_value):
        raw = top_value / 6
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        return [i * step for i in range(int(top_value / step) + 1)]

    s = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">examples/service.rs: goodput against offered load</text>',
        f'<text x="{left}" y="39" fill="#555">limit {meta["limit"]}, query ~{meta["query_ms"]} ms, timeout '
        f'{meta["timeout_ms"]} ms; oha fixed rate; median of {meta["rounds"]} rounds, bars min–max; {meta["date"][:10]}</text>',
    ]
    for t in ticks(xmax):
        s.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{top + ph}" stroke="#eee"/>')
        s.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t:g}</text>')
    for t in ticks(ymax):
        s.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{left + pw}" y2="{y(t):.1f}" stroke="#eee"/>')
        s.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    s.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    s.append(f'<text x="{left + pw / 2}" y="{h - 18}" text-anchor="middle">offered load (requests/s)</text>')
    s.append(f'<text x="18" y="{top + ph / 2}" text-anchor="middle" '
             f'transform="rotate(-90 18 {top + ph / 2})">goodput (200s/s)</text>')
    # What a perfect server answers: everything up to the capacity.
    s.append(f'<polyline points="{x(0):.1f},{y(0):.1f} {x(capacity):.1f},{y(capacity):.1f} '
             f'{x(xmax):.1f},{y(capacity):.1f}" fill="none" stroke="#888" stroke-dasharray="5,4"/>')
    s.append(f'<text x="{x(xmax) - 4:.1f}" y="{y(capacity) - 6:.1f}" text-anchor="end" fill="#666">'
             f'capacity {capacity:.1f}/s</text>')
    for variant in VARIANTS:
        rows = [r for r in summary if r["variant"] == variant]
        if not rows:
            continue
        c = COLOURS.get(variant) or MORE_COLOURS[(VARIANTS.index(variant) - 2) % len(MORE_COLOURS)]
        pts = " ".join(f'{x(r["rate"]["median"]):.1f},{y(r["goodput"]["median"]):.1f}' for r in rows)
        s.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        for r in rows:
            # The variants' bars side by side, not on top of each other.
            cx = x(r["rate"]["median"]) + 3 * (VARIANTS.index(variant) - (len(VARIANTS) - 1) / 2)
            s.append(f'<line x1="{cx:.1f}" y1="{y(r["goodput"]["min"]):.1f}" x2="{cx:.1f}" '
                     f'y2="{y(r["goodput"]["max"]):.1f}" stroke="{c}"/>')
            cy = y(r["goodput"]["median"])
            if variant == "naive":
                s.append(f'<rect x="{cx - 4:.1f}" y="{cy - 4:.1f}" width="8" height="8" fill="none" stroke="{c}" stroke-width="1.5"/>')
            else:
                s.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{c}"/>')
    ly = top + 10
    labels = {
        "offloader": ("offloader: with_timeout", "+ CancelAndStop"),
        "naive": ("naive: Semaphore +", "spawn_blocking + timeout"),
    }
    shown = [v for v in VARIANTS if any(r["variant"] == v for r in summary)]
    for variant in shown:
        label, second = labels.get(variant, (variant, ""))
        c = COLOURS.get(variant) or MORE_COLOURS[(VARIANTS.index(variant) - 2) % len(MORE_COLOURS)]
        s.append(f'<line x1="{left + pw + 14}" y1="{ly}" x2="{left + pw + 34}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        s.append(f'<text x="{left + pw + 40}" y="{ly + 4}">{label}</text>')
        s.append(f'<text x="{left + pw + 40}" y="{ly + 18}">{second}</text>')
        ly += 40
    s.append(f'<line x1="{left + pw + 14}" y1="{ly}" x2="{left + pw + 34}" y2="{ly}" stroke="#888" stroke-dasharray="5,4"/>')
    s.append(f'<text x="{left + pw + 40}" y="{ly + 4}">ideal</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def report(work, prefix):
    with open(os.path.join(work, "meta.json")) as f:
        meta = json.load(f)
    cap_start = count_200_per_second(os.path.join(work, "capacity-start.csv"), meta["capacity_seconds"])
    cap_end = count_200_per_second(os.path.join(work, "capacity-end.csv"), meta["capacity_seconds"])
    with open(os.path.join(work, "runs.tsv")) as f:
        index = list(csv.DictReader(f, delimiter="\t"))
    for run in index:
        run["rate"] = int(run["rate"])
        run["round"] = int(run["round"])
    runs = [figures(work, run, meta) for run in index]
    summary = summarize(runs)
    checks = targets(runs, cap_start, meta)
    commands = {
        "capacity": command(work, "capacity-start"),
        "fixed_rate": [r["command"] for r in runs if r["round"] == 1],
    }
    result = {
        "meta": meta,
        "capacity": {"start": cap_start, "end": cap_end},
        "commands": commands,
        "targets": checks,
        "summary": summary,
        "runs": runs,
    }
    with open(prefix + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(prefix + ".svg", "w") as f:
        f.write(svg(summary, cap_start, meta))

    base = os.path.basename(prefix)
    md = [
        f"# examples/service.rs under oha, {meta['date'][:10]}",
        "",
        f"Commit `{meta['commit']}`; {meta['cpu']}, {meta['vcpus']} vCPUs, kernel {meta['kernel']}, "
        f"{meta['rustc']}, {meta['oha']}. Load average before the run {meta['load_before']}, "
        f"after {meta['load_after']}. The load generator runs on the same two cores. "
        f"Wall time {meta['wall_seconds'] // 60} min {meta['wall_seconds'] % 60} s.",
        "",
        f"The service: limit {meta['limit']}, a query of {meta['rows']} rows (~{meta['query_ms']} ms alone), "
        f"per-request timeout {meta['timeout_ms']} ms. Capacity (the offloader variant, 10 s timeout, closed "
        f"loop of 16 connections, 200s per second): **{cap_start:.1f}/s** at the start, {cap_end:.1f}/s at "
        f"the end. Loads are multiples of the start's figure; {meta['rounds']} rounds of "
        f"{meta['seconds_per_run']} s per variant and load, medians (goodput: min–max).",
        "",
        f"![goodput against offered load]({base}.svg)",
        "",
        table(summary),
        "",
        f"Other processes used {fmt(statistics.median(r['others_cores'] for r in runs), 2)} cores "
        f"during the median run (max {fmt(max(r['others_cores'] for r in runs), 2)}, in "
        f"`{max(runs, key=lambda r: r['others_cores'])['variant']}` at "
        f"{max(runs, key=lambda r: r['others_cores'])['factor']}×); oha "
        f"{fmt(statistics.median(r['oha_cores'] for r in runs), 2)} cores (median). The JSON has these per run; "
        f"the table's last column is the most other processes used in any round of that row, in cores of 2. "
        f"Before each run the script waited for a quiet machine ({meta.get('quiet_waited_seconds', 0)} s in all).",
        "",
        "Columns: goodput is 200s per second of the run; `503 %` of the answered requests; latencies are "
        "per status from oha's per-request CSV, counted from when each request was due "
        "(`--latency-correction`); `max in flight` is the most SQLite queries running at once, counted "
        "around the call by the service; threads is the most seen in /proc/self/task (read twice a "
        "second), RSS the peak (VmHWM); `started`/`interrupted` are SQLite queries begun and ended by "
        "the interrupt; `200s / started` is the share of started queries that became an answer someone "
        "still waited for.",
        "",
        "## Every round",
        "",
        "`refused` counts the 503s refused at admission, with the p99 of the handler's own time for "
        "them (from the handler's start to its response, measured by the service); `shed` the 503s shed "
        "at their turn; `timed out` the 503s at the caller's timeout. `503 p99 less shed and timed out` "
        "leaves out as many of the slowest 503s as were shed or timed out: about the p99 of the "
        "refusals as oha saw them.",
        "",
        rounds_table(runs),
        "",
        "## Issue 32's targets (offloader variant)",
        "",
        "| target | median | pass | rounds held | per round |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in checks:
        per = ", ".join(fmt(v, 1) for v in c["per_round"])
        md.append(f"| {c['target']} | {fmt(c['median'], 1)} | {verdict(c['pass'])} "
                  f"| {c['rounds_held']} of {c['rounds']} | {per} |")
    md += [
        "",
        "## Commands",
        "",
        "```sh",
        f"benches/service/run.sh   # ROUNDS={meta['rounds']} SECONDS_PER_RUN={meta['seconds_per_run']}",
        "# capacity:",
        commands["capacity"],
        "# each load, round 1 (the port changes per run):",
        *commands["fixed_rate"],
        "```",
        "",
        "The servers: `target/release/examples/service --addr ADDR --timeout-ms "
        f"{meta['timeout_ms']} --rows {meta['rows']} [--naive]`.",
        "",
    ]
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(md))
    print(table(summary))
    print()
    print(rounds_table(runs))
    print()
    for c in checks:
        print(f"{verdict(c['pass'])}  {c['target']}: median {fmt(c['median'], 1)} "
              f"({c['rounds_held']} of {c['rounds']} rounds)")
    print()
    print("capacity:", commands["capacity"])
    for c in commands["fixed_rate"]:
        print("load:", c)
    print(f"\nwrote {prefix}.json, {prefix}.md, {prefix}.svg")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--capacity":
        print(round(count_200_per_second(sys.argv[2], float(sys.argv[3])), 1))
    elif len(sys.argv) == 4 and sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
