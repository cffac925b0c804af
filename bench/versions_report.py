"""The report of bench/versions: from its TSV (argument), markdown on stdout.

Per workload, the extension's median rate on each major, and each newer major's ratio to the
first (the base) computed round by round (the runs of one round are seconds apart, so the
machine's load changes less between them than between rounds): the median and the range."""
import statistics
import sys
from collections import defaultdict

NAMES = {"claim_new": "claim_new (claim a new key)", "cycle": "cycle (BEGIN, claim, complete, COMMIT)",
         "replay": "replay (claim a completed key)", "hot_key": "hot_key (100 hot keys, duplicates wait)",
         "reap": "reap (idem_reap_all, keys/s)"}


def main(path):
    meta, rate, growth, versions = {}, defaultdict(dict), defaultdict(list), []
    instr = defaultdict(dict)  # workload -> version -> (total, without printing, in the extension)
    with open(path) as f:
        for line in f:
            row = line.rstrip("\n").split("\t")
            if row[0] == "meta":
                meta[row[1]] = row[2]
            elif row[0] == "tps":
                _, v, wl, var, rnd, value = row
                rate[(wl, var)].setdefault(v, {})[int(rnd)] = float(value)
                if v not in versions:
                    versions.append(v)
            elif row[0] == "instr":
                _, v, wl, total, quiet, ours = row
                instr[wl][v] = (int(total), int(quiet), int(ours))
                if v not in versions:
                    versions.append(v)
            elif row[0] == "growth":
                _, v, rnd, pages, reaped, ms = row
                growth[v].append((int(rnd), int(pages), int(reaped), float(ms)))
    base, newer = versions[0], versions[1:]
    print(f"# PostgreSQL {', '.join(newer)} against {base}\n")
    for key in ("date", "command", "commit", "machine", "settings", "elapsed"):
        if key in meta:
            print(f"- {key}: {meta[key]}")
    for v in versions:
        if "server " + v in meta:
            print(f"- {v}: {meta['server ' + v]}")
    print()
    if instr:
        print_instructions(instr, versions)
        return
    head = "| workload | " + " | ".join(f"{v} median" for v in versions) + " | " + \
        " | ".join(f"{v} / {base} (range)" for v in newer) + " | " + \
        " | ".join(f"ext / ref on {v}" for v in versions) + " |"
    print(head)
    print("|" + "---|" * head.count(" | ") + "---|")
    for wl in ("claim_new", "cycle", "replay", "hot_key", "reap"):
        ext = rate.get((wl, "ext"))
        if not ext:
            continue
        cells = [f"{statistics.median(ext[v].values()):.0f}" if v in ext else "-" for v in versions]
        for v in newer:
            ratios = [ext[v][r] / ext[base][r] for r in ext.get(v, {}) if r in ext.get(base, {})]
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"
                         if ratios else "-")
        ref = rate.get((wl, "a"), {})
        for v in versions:
            ratios = [ext[v][r] / ref[v][r] for r in ext.get(v, {}) if r in ref.get(v, {})]
            cells.append(f"{statistics.median(ratios):.2f}" if ratios else "-")
        print(f"| {NAMES[wl]} | " + " | ".join(cells) + " |")
    if growth:
        print("\nReaping as idem_keys grows (bench/reap_growth.sql): microseconds per reaped key\n")
        print("| round | table pages | " + " | ".join(versions) + " |")
        print("|---|---|" + "---|" * len(versions))
        rounds = sorted({g[0] for gs in growth.values() for g in gs})
        for rnd in rounds:
            pages = next((g[1] for g in growth[base] if g[0] == rnd), "-")
            cells = []
            for v in versions:
                g = next((g for g in growth[v] if g[0] == rnd), None)
                cells.append(f"{g[3] * 1000 / g[2]:.2f}" if g else "-")
            print(f"| {rnd} | {pages} | " + " | ".join(cells) + " |")


def print_instructions(instr, versions):
    """bench/instructions on each version: instructions per call (without single-user mode's
    printing of results), and inside the extension's SQL functions; ratios to the first."""
    base, newer = versions[0], versions[1:]
    print("Instructions per call (callgrind; without single-user mode's printing of results), and in "
          "parentheses those inside the extension's SQL functions\n")
    head = "| workload | " + " | ".join(versions) + " | " + " | ".join(f"{v} / {base}" for v in newer) + " |"
    print(head)
    print("|" + "---|" * (head.count(" | ") + 1))
    for wl in ("claim", "cycle", "replay", "select"):
        if wl not in instr:
            continue
        row = instr[wl]
        cells = [f"{row[v][1]:,} ({row[v][2]:,})" if v in row else "-" for v in versions]
        for v in newer:
            if v in row and base in row:
                inside = f", {row[v][2] / row[base][2]:.3f}" if row[base][2] else ""
                cells.append(f"{row[v][1] / row[base][1]:.3f}{inside}")
            else:
                cells.append("-")
        print(f"| {wl} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
