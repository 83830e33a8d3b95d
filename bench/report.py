#!/usr/bin/env python3
"""Turn docs/bench/peers.json (bench/peers.py) into a Markdown report and PNG plots.

    report.py peers.json peers.md IMGDIR
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, md_out, img = sys.argv[1:4]
R = json.load(open(src))
S = {k: v for k, v in R["systems"].items() if "error" not in v}
FAILED = {k: v for k, v in R["systems"].items() if "error" in v}

# (key, label, unit, lower is better, getter)
WORKLOADS = [
    ("mount_first", "first mount (tar.gz: index pass)", "s", lambda r: r.get("mount_first")),
    ("mount", "mount", "s", lambda r: r.get("mount_median", r["mount"])),
    ("find1", "find, first", "s", lambda r: r["find1"]),
    ("find2", "find, again", "s", lambda r: r.get("find2_median", r["find2"])),
    ("stat", "stat every path", "s", lambda r: r.get("stat_median", r["stat"])),
    ("read1", "read all, cold", "s", lambda r: r.get("read1_median", r["read1"])),
    ("read2", "read all, warm", "s", lambda r: r.get("read2_median", r["read2"])),
    ("small_p50", "small file p50", "ms", lambda r: r["small"]["p50_ms"]),
    ("small_p99", "small file p99", "ms", lambda r: r["small"]["p99_ms"]),
    ("large_seq", "24 MB file, sequential", "s", lambda r: R_large_mb() / r["large_seq"]),
    ("large_p50", "24 MB file, 4K random p50", "ms", lambda r: r["large_rand"]["p50_ms"]),
    ("huge_p50", "1 GiB member, 4K random p50", "ms", lambda r: r["huge_rand"]["p50_ms"]),
    ("huge_p99", "1 GiB member, 4K random p99", "ms", lambda r: r["huge_rand"]["p99_ms"]),
    ("rss", "daemon peak RSS", "MB", lambda r: r["rss_mb"]),
]


def R_large_mb():
    return R["corpus"].get("large_size", 0) / 1e6


def val(key, sysk):
    try:
        v = dict((w[0], w[3]) for w in WORKLOADS)[key](S[sysk])
        return None if v is None else float(v)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def fmt(v, unit):
    if v is None:
        return "—"
    if unit == "ms":
        return f"{v:.2f}"
    if unit == "MB":
        return f"{v:.0f}"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}"


m = R["machine"]
WHEN = {S[k].get("measured") for k in S}
lines = [
    f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gb']} GB, Linux {m['kernel']}, "
    f"{m['date']}, {m['pkgfs']}. Corpus: Linux 6.1 source, {R['corpus']['files']} files; "
    f"small-file sample {R['corpus']['small_sample']} files under 16 KiB; large file "
    f"`{R['corpus']['large_file']}`; a 1 GiB member of kernel C text. Every number is one "
    "run of `bench/peers.sh`; "
    + ("all systems in the same run." if len(WHEN) <= 1 else
       "systems measured at (a whole run takes half an hour; `--merge` reruns some): "
       + "; ".join(f"{S[k]['name']}: {S[k].get('measured', '?')}" for k in S) + "."),
    "",
    "pkgfs's requests travelled over: "
    + "; ".join(f"{S[k]['name']}: {S[k].get('transport', '/dev/fuse (not recorded)')}"
                for k in S if k.startswith("pkgfs"))
    + " (FUSE over io_uring needs the fuse module's `enable_uring`, off by default; "
    "docs/ARCHITECTURE.md, \"Transports\").",
    "",
    "### Raw numbers (lower is better)",
    "",
    "| workload | " + " | ".join(S[k]["name"] for k in S) + " |",
    "| --- |" + " --- |" * len(S),
]
for key, label, unit, _ in WORKLOADS:
    lines.append(f"| {label} ({unit}) | " + " | ".join(fmt(val(key, k), unit) for k in S) + " |")
for k, v in FAILED.items():
    lines.append("")
    lines.append(f"{v['name']}: failed: {v['error']}")
for k, v in S.items():
    if v.get("timeouts"):
        lines.append("")
        lines.append(f"{v['name']}: stopped after {180} s in: {', '.join(v['timeouts'])} "
                     "(— in the table; latencies over what was read in that time).")
    if v.get("errors"):
        lines.append("")
        lines.append(f"{v['name']}: {len(v['errors'])} errors while measuring (timed anyway), "
                     f"first: `{v['errors'][0][:160]}`")

ROUNDED = {k: [v["read1"]] + v["read1_rounds"] for k, v in S.items() if v.get("read1_rounds")}
if ROUNDED:
    n = max(len(t) for t in ROUNDED.values())
    lines += ["", "### Cold read-all, round by round (s; the table gives the median)", "",
              "Each system read everything cold once in its session, then again in "
              f"{n - 1} rounds that take the systems in turn (`--rounds`), so a slow "
              "minute of the machine weighs on every system alike. Each round mounts "
              "cold too: the mount row is also a median, of "
              + ", ".join(f"{S[k]['name']} " + " / ".join(
                  fmt(t, "s") for t in [S[k]["mount"]] + S[k].get("mount_rounds", []))
                  for k in ROUNDED if S[k].get("mount_rounds")) + " s.", "",
              "| system | run of | " + " | ".join(f"run {i + 1}" for i in range(n)) + " |",
              "| --- | --- |" + " --- |" * n]
    for k, runs in ROUNDED.items():
        lines.append(f"| {S[k]['name']} | {S[k].get('run', '?')} | "
                     + " | ".join(fmt(t, "s") for t in runs) + " |")
    if "extracted" in ROUNDED:
        ext = ROUNDED["extracted"]
        # Round by round only within one run: other runs' rounds are other minutes.
        same = {k: v for k, v in ROUNDED.items()
                if S[k].get("run") and S[k].get("run") == S["extracted"].get("run")}
        lines += ["", "Extracted tree's time ÷ system time, round by round, for the systems of "
                  f"the extracted tree's run ({S['extracted'].get('run', '?')}; runs 2 and on "
                  "are interleaved; run 1 is each system's own session):", "",
                  "| system | " + " | ".join(f"run {i + 1}" for i in range(n)) + " |",
                  "| --- |" + " --- |" * n]
        for k, runs in same.items():
            if k == "extracted":
                continue
            lines.append(f"| {S[k]['name']} | " + " | ".join(
                "—" if a is None or b is None else f"{a / b:.2f}"
                for a, b in zip(ext, runs)) + " |")

KS = "kernel-squashfs"
if KS in S and S[KS].get("stat_rounds"):
    same = [k for k in S if k != KS and S[k].get("stat_rounds")
            and S[k].get("run") and S[k].get("run") == S[KS].get("run")]
    n = 1 + len(S[KS]["stat_rounds"])
    if same:
        lines += ["", "### Warm workloads, round by round: system time ÷ kernel squashfs time "
                  "(the target: at most 1.5; the table gives the medians)", "",
                  f"Run {S[KS].get('run', '?')}; run 1 is each system's own session (after two "
                  "finds of a fresh mount), runs 2 and on follow the round's cold read-all.", "",
                  "| system | workload | " + " | ".join(f"run {i + 1}" for i in range(n)) + " |",
                  "| --- | --- |" + " --- |" * n]
        for k in same:
            for key, label in (("find2", "find, again"), ("stat", "stat every path"),
                               ("read2", "read all, warm")):
                ours = [S[k].get(key)] + S[k].get(f"{key}_rounds", [])
                theirs = [S[KS].get(key)] + S[KS].get(f"{key}_rounds", [])
                lines.append(f"| {S[k]['name']} | {label} | " + " | ".join(
                    "—" if a is None or b is None else f"{a / b:.2f}"
                    for a, b in zip(ours, theirs)) + " |")

for ref in ("squashfuse_ll", "extracted", "kernel-squashfs"):
    if ref not in S:
        continue
    lines += ["", f"### Ratios: {S[ref]['name']} time ÷ system time (above 1: faster than it)", "",
              "| workload | " + " | ".join(S[k]["name"] for k in S) + " |",
              "| --- |" + " --- |" * len(S)]
    for key, label, unit, _ in WORKLOADS:
        if key == "rss":
            continue
        row = []
        for k in S:
            a, b = val(key, ref), val(key, k)
            row.append("—" if a is None or b is None or b == 0 else f"{a / b:.2f}")
        lines.append(f"| {label} | " + " | ".join(row) + " |")

if "scaling" in R:
    lines += ["", "### Scaling: pkgfs mount of generated packages (100 entries each, stored)", "",
              "| packages | entries | mount (s, best of 3) | daemon RSS (MB) |", "| --- | --- | --- | --- |"]
    for s in R["scaling"]:
        lines.append(f"| {s['packages']} | {s['entries']} | {s['mount_s']:.2f} | {s['rss_mb']:.0f} |")

open(md_out, "w").write("\n".join(lines) + "\n")

# Bars: one panel per workload, one bar per system.
keys = list(S)
colors = {k: c for k, c in zip(keys, plt.cm.tab10.colors)}
panels = [w for w in WORKLOADS]
cols = 4
rows = (len(panels) + cols - 1) // cols
fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows))
for ax, (key, label, unit, _) in zip(axes.flat, panels):
    vals = [val(key, k) for k in keys]
    xs = [i for i, v in enumerate(vals) if v is not None]
    ax.bar(xs, [vals[i] for i in xs], color=[colors[keys[i]] for i in xs])
    ax.set_title(f"{label} ({unit})", fontsize=10)
    ax.set_xticks([])
    if any(v for v in vals if v) and max(v for v in vals if v is not None) / max(
            min(v for v in vals if v), 1e-9) > 50:
        ax.set_yscale("log")
for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in keys]
fig.legend(handles, [S[k]["name"] for k in keys], loc="lower center", ncol=4, fontsize=9)
fig.suptitle("Linux 6.1 source: pkgfs and its peers (lower is better)", fontsize=13)
fig.tight_layout(rect=(0, 0.07, 1, 0.96))
fig.savefig(f"{img}/bench-peers.png", dpi=90)

if "scaling" in R:
    sc = R["scaling"]
    fig, ax1 = plt.subplots(figsize=(6.5, 4))
    e = [s["entries"] for s in sc]
    ax1.plot(e, [s["mount_s"] for s in sc], "o-", color="tab:blue", label="mount time (s)")
    ax1.set_xlabel("entries (100 per package)")
    ax1.set_ylabel("mount time (s)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(e, [s["rss_mb"] for s in sc], "s--", color="tab:red", label="peak RSS (MB)")
    ax2.set_ylabel("daemon peak RSS (MB)", color="tab:red")
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    for s in sc:
        ax1.annotate(f"{s['packages']} pkgs", (s["entries"], s["mount_s"]), fontsize=8,
                     textcoords="offset points", xytext=(4, -10))
    fig.suptitle("pkgfs: mount time and memory against entries")
    fig.tight_layout()
    fig.savefig(f"{img}/bench-scaling.png", dpi=90)
