"""Run executorch's own XNNPACK tests stock and with xnnfold's partitioner; compare outcomes.

    .venv/bin/python conformance/run.py                 # both modes, then compare
    .venv/bin/python conformance/run.py --mode xnnfold  # one mode (the other's XML is reused)
    .venv/bin/python conformance/run.py --summarize     # only compare existing XMLs
    .venv/bin/python conformance/run.py --seed none     # unseeded: the tests exactly as shipped

By default every test is seeded (plugin option --xnnfold-seed; base 0 + crc32 of its id) so
that both modes see the same random weights, inputs and dynamic shapes: several of these tests
fail on some random draws, stock as much as xnnfold (see conformance/paired.py).

Each mode is ONE pytest process (never parallel; the modes run one after the other) over the
test files shipped in the executorch wheel, unchanged:

    stock:   pytest -p xnnfold_swap ...            (the plugin only counts)
    xnnfold: pytest -p xnnfold_swap --xnnfold ...  (xnnfold.XnnpackPartitioner swapped in)

Writes, under --out (default out/conformance): {stock,xnnfold}.xml (JUnit), .log (pytest
output), .plugin.json (swap record: hook calls, partitioners constructed) and summary.md.

Exit status: 0 if both modes ran and pass the same tests; 1 if the sets of passing tests
differ; 2 if a mode did not produce its XML or the xnnfold swap check failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODES = ("stock", "xnnfold")
GEMM_OPS = ("ops/test_linear.py", "ops/test_conv1d.py", "ops/test_conv2d.py")
# What the upstream draft PR ran (passes, ops, serialization, quantizer, the partitioner tests),
# plus recipes and the model tests that import on this torch (the others need torchvision,
# torchaudio, timm or torchsr, and mobilenet/resnet/inception download pretrained weights).
# Model files are not named test_*.py: pytest collects them because they are given explicitly.
# One suite = one pytest process per mode; the suites run one after the other, each stock then
# xnnfold, so a run stopped part-way still has both modes of every suite it finished.
SUITES = {
    "serialization": ("serialization",),
    "passes": ("passes",),
    "partitioner": ("test_xnnpack_partitioner.py",),
    "quantizer": ("quantizer",),
    "ops": ("ops",),                       # minus GEMM_OPS, which get a suite of their own
    "ops-gemm": GEMM_OPS,
    "recipes": ("recipes",),
    "models": ("models/mobilebert.py", "models/llama2_et_example.py",
               "models/very_big_model.py"),
}
DEFAULT_SUITES = tuple(SUITES)
OUTCOMES = ("passed", "failed", "error", "skipped")


def test_root() -> Path:
    """executorch/backends/xnnpack/test in the installed wheel, found without importing torch."""
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("executorch is not installed in this interpreter")
    for location in spec.submodule_search_locations:
        root = Path(location) / "backends" / "xnnpack" / "test"
        if root.is_dir():
            return root
    sys.exit("executorch/backends/xnnpack/test not found")


def pytest_command(mode: str, root: Path, files, out: Path, extra, seed, tag: str = "") -> list:
    ignore = [f"--ignore={root / f}" for f in GEMM_OPS if "ops" in files]
    stem = f"{mode}.{tag}" if tag else mode
    return [
        sys.executable, "-m", "pytest",
        "-c", os.devnull,            # not this repo's pytest config (testpaths, filters)
        "--rootdir", str(root),
        # Import the test files as executorch.backends.xnnpack.test.*: the default
        # rootdir-based import would load a second copy of executorch's partitioner module as
        # backends.xnnpack.partition.xnnpack_partitioner (executorch is a namespace package).
        "--import-mode=importlib", "-o", "consider_namespace_packages=true",
        "-o", "junit_family=xunit1",  # gives each testcase its file
        "-p", "no:cacheprovider", "-p", "no:hydra_pytest",
        # pytest-randomly (the test extra) would shuffle the order with a new seed per process
        # and reseed random/numpy after the plugin's per-test seed: the two modes would run the
        # tests in different orders on different draws.
        "-p", "no:randomly",
        "-p", "xnnfold_swap", *(["--xnnfold"] if mode == "xnnfold" else []),
        "--xnnfold-report", str(out / f"{stem}.plugin.json"),
        *(["--xnnfold-seed", str(seed)] if seed is not None else []),
        "--junitxml", str(out / f"{stem}.xml"),
        "-q", "-rfEs", "--durations=15",
        *ignore, *extra,
        *[str(root / f) for f in files],
    ]


def run_mode(mode: str, root: Path, files, out: Path, extra, threads: str, seed,
             tag: str = "") -> dict:
    stem = f"{mode}.{tag}" if tag else mode
    for stale in (out / f"{stem}.xml", out / f"{stem}.plugin.json"):
        stale.unlink(missing_ok=True)
    cmd = pytest_command(mode, root, files, out, extra, seed, tag)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env.pop("XNNFOLD_SWAP", None)   # the mode is given by --xnnfold only
    if threads:
        env["OMP_NUM_THREADS"] = threads
    env.setdefault("PYTHONHASHSEED", "0")
    log = out / f"{stem}.log"
    print(f"[conformance] {stem}: {shlex.join(cmd)}", flush=True)
    print(f"[conformance] {stem}: log {log}", flush=True)
    start = time.time()
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(cmd)}\n\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    seconds = time.time() - start
    print(f"[conformance] {stem}: pytest exit {rc} in {seconds / 60:.1f} min", flush=True)
    return {"rc": rc, "seconds": round(seconds, 1), "command": shlex.join(cmd),
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            "summary_line": last_summary_line(log)}


def last_summary_line(log: Path) -> str:
    """pytest's final '3 failed, 68 passed, 2 subtests passed in 9.1s' line ('=' around it
    without -q)."""
    import re
    if not log.exists():
        return ""
    pattern = re.compile(r"^\d+ (passed|failed|error|errors|skipped|deselected|subtests?)\b"
                         r".* in [\d.]+s")
    lines = [l.strip("= ") for l in log.read_text(errors="replace").splitlines()]
    lines = [l for l in lines if pattern.match(l) or l.startswith("no tests ran")]
    return lines[-1] if lines else ""


def subtest_counts(summary_line: str, log: Path) -> Counter:
    """Subtests passed and failed. pytest 9 prints '8 subtests passed' in its summary line but
    counts a failed subtest among the failed *tests* of that line, with a 'SUBFAILED(...)' line
    in the short summary (-rf): failures are counted from those lines."""
    import re
    counts = Counter({m.group(2): int(m.group(1))
                      for m in re.finditer(r"(\d+) subtests? (passed|failed|skipped|xfailed)",
                                           summary_line)})
    if log.exists():
        counts["failed"] = max(counts["failed"], sum(
            line.startswith("SUBFAILED") for line in log.read_text(errors="replace").splitlines()))
    return counts


def parse_junit(path: Path) -> dict:
    """test id -> {outcome, file, time, message}."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        file = case.get("file") or classname.replace(".", "/") + ".py"
        test_id = f"{file}::{classname.rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("error", "failure", "skipped"):      # most severe first
            element = case.find(tag)
            if element is not None:
                outcome = {"error": "error", "failure": "failed", "skipped": "skipped"}[tag]
                message = (element.get("message") or element.text or "").strip()
                break
        results[test_id] = {"outcome": outcome, "file": file,
                            "time": float(case.get("time") or 0), "message": message}
    return results


def first_line(message: str, limit: int = 160) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = line.replace("|", "\\|")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def versions() -> str:
    parts = []
    for dist in ("torch", "executorch", "torchao", "pytest"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                             capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO,
                               text=True, capture_output=True).stdout.strip()
        parts.append(f"xnnfold @ {rev}{' (src/ modified)' if dirty else ''}")
    except OSError:
        pass
    return ", ".join(parts)


def merge_plugin(records: list) -> dict | None:
    """One swap record from the per-suite records of one mode (counts summed, maps merged)."""
    records = [r for r in records if r]
    if not records:
        return None
    merged = dict(records[0])
    for key in ("hook_calls_total", "hook_errors_total", "folded_operands_total",
                "declined_operands_total", "tests_collected"):
        merged[key] = sum(r.get(key, 0) for r in records)
    for key in ("hook_calls", "hook_errors", "hook_records", "constructed", "rng"):
        merged[key] = {k: v for r in records for k, v in r.get(key, {}).items()}
    for key in ("fallbacks", "problems"):
        merged[key] = [x for r in records for x in r.get(key, [])]
    merged["swapped_modules"] = sorted({m for r in records for m in r.get("swapped_modules", [])})
    merged["bound_modules"] = {side: sorted({m for r in records
                                             for m in r.get("bound_modules", {}).get(side, [])})
                               for side in ("xnnfold", "stock")}
    totals = Counter()
    for r in records:
        totals.update(r.get("constructed_total", {}))
    merged["constructed_total"] = dict(totals)
    if merged.get("mode") == "xnnfold" and merged["hook_calls_total"] == 0:
        merged["problems"].append("xnnfold's transform_for_pre_decomposition never ran in any "
                                  "suite: the swap did not take effect")
    return merged


def load_mode(out: Path, mode: str, suites) -> tuple:
    """(results, plugin record, suites with results) of one mode: the per-suite files
    `{mode}.{suite}.xml`, or the single `{mode}.xml` of a run with --files."""
    stems = [f"{mode}.{suite}" for suite in suites] if suites else [mode]
    results, records, found = {}, [], []
    for stem in stems:
        xml = out / f"{stem}.xml"
        if not xml.exists():
            continue
        results.update(parse_junit(xml))
        report = out / f"{stem}.plugin.json"
        records.append(json.loads(report.read_text()) if report.exists() else None)
        found.append(stem.split(".", 1)[-1])
    return results, merge_plugin(records), found


def summarize(out: Path, runs: dict, files, suites=()) -> int:
    results, plugin, missing, found = {}, {}, [], {}
    for mode in MODES:
        mode_results, record, found[mode] = load_mode(out, mode, suites)
        if not mode_results:
            missing.append(mode)
            continue
        results[mode], plugin[mode] = mode_results, record
    if suites:
        incomplete = [s for s in suites if not all(s in found[m] for m in MODES)]
        if len(results) == 2 and incomplete:
            # Compare only the suites that finished in both modes.
            keep = [s for s in suites if s not in incomplete]
            for mode in MODES:
                results[mode], plugin[mode], _ = load_mode(out, mode, keep)
            results = {m: r for m, r in results.items() if r}

    lines = ["# Conformance: executorch's XNNPACK tests, stock vs xnnfold.XnnpackPartitioner", ""]
    lines += [f"Generated {datetime.datetime.now().isoformat(timespec='seconds')} by "
              f"`conformance/run.py`; {versions()}.", ""]
    if suites:
        lines += ["Suites (test files unchanged, from the installed wheel, "
                  "`executorch/backends/xnnpack/test/`): " + "; ".join(
                      f"{s} = " + ", ".join(f"`{f}`" for f in SUITES[s]) for s in suites), ""]
        for s in suites:
            if not all(s in found[m] for m in MODES):
                lines.append(f"- **suite {s} did not finish in both modes** (stock: "
                             f"{'done' if s in found['stock'] else 'not run'}, xnnfold: "
                             f"{'done' if s in found['xnnfold'] else 'not run'}): left out of "
                             "the comparison below")
        lines.append("")
    else:
        lines += ["Test files (unchanged, from the installed wheel, "
                  "`executorch/backends/xnnpack/test/`): " + ", ".join(f"`{f}`" for f in files), ""]

    status = 0
    if missing:
        lines += [f"**Missing results for: {', '.join(missing)}** (no JUnit XML).", ""]
        status = 2

    # -- counts per file per mode
    all_files = sorted({r["file"] for mode in results for r in results[mode].values()})
    header = "| file | " + " | ".join(f"{m} passed / failed / error / skipped"
                                       for m in results) + " |"
    lines += ["## Outcomes per file", "", header,
              "|---|" + "---|" * len(results)]
    totals = {m: Counter() for m in results}
    for file in all_files:
        row = [f"`{file}`"]
        for mode in results:
            c = Counter(r["outcome"] for r in results[mode].values() if r["file"] == file)
            totals[mode].update(c)
            seconds = sum(r["time"] for r in results[mode].values() if r["file"] == file)
            row.append(" / ".join(str(c.get(o, 0)) for o in OUTCOMES)
                       + f" ({seconds / 60:.1f} min)")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| **total** | " + " | ".join(
        "**" + " / ".join(str(totals[m].get(o, 0)) for o in OUTCOMES) + "**"
        for m in results) + " |")
    lines.append("")

    # -- wall time per mode
    stems = [f"{m}.{x}" for x in suites for m in MODES] if suites else list(MODES)
    lines += ["## Runs", "", "| suite / mode | wall time | pytest exit | pytest's summary line |",
              "|---|---|---|---|"]
    subtests = {m: Counter() for m in MODES}
    for stem in stems:
        run = runs.get(stem)
        if not run:
            continue
        mode = stem.split(".", 1)[0]
        run["summary_line"] = last_summary_line(out / f"{stem}.log") or run.get("summary_line", "")
        subtests[mode].update(subtest_counts(run["summary_line"], out / f"{stem}.log"))
        lines.append(f"| {stem} | {run['seconds'] / 60:.1f} min | {run.get('rc', '-')} | "
                     f"{run.get('summary_line', '')} |")
    lines.append("")
    lines += ["| mode | failed | passed | skipped | errors | subtests passed / failed | "
              "per-test seed base | plugin check |", "|---|---|---|---|---|---|---|---|"]
    for mode in results:
        c, p = totals[mode], plugin.get(mode)
        check = "n/a" if p is None else ("OK" if not p["problems"] else "FAILED")
        seed = p.get("seed", "-") if p else "-"
        lines.append(f"| {mode} | {c.get('failed', 0)} | {c.get('passed', 0)} | "
                     f"{c.get('skipped', 0)} | {c.get('error', 0)} | "
                     f"{subtests[mode].get('passed', 0)} / {subtests[mode].get('failed', 0)} | "
                     f"{'none (unseeded)' if seed is None else seed} | {check} |")
    lines.append("")

    # -- which tests reach xnnfold's hook
    p = plugin.get("xnnfold")
    if p is not None and "xnnfold" in results:
        fold_class = p.get("xnnfold_class")
        constructed = p.get("constructed", {})
        reached = {t for t, n in p["hook_calls"].items() if n}
        built_ours = {t for t, c in constructed.items() if c.get(fold_class)}
        built_other = {t for t, c in constructed.items() if c and not c.get(fold_class)}
        ids = set(results["xnnfold"])

        def short(nodeid):      # plugin ids are relative to --rootdir, JUnit ids carry the file
            return nodeid.split("::", 1)[-1]
        n_tests = len(ids)
        n_reached = len({short(t) for t in reached})
        never = sorted(short(t) for t in built_ours - reached)
        lines += ["## Which tests reach xnnfold's hook (xnnfold mode)", "",
                  f"- {n_tests} tests ran; {n_reached} called "
                  "`transform_for_pre_decomposition` at least once (`to_edge_transform_and_lower`)",
                  f"- **{len(never)} constructed xnnfold's partitioner but never reached its hook** "
                  "(they lower with `to_edge` + `to_backend`, the tester's `Partition` stage, which "
                  "does not call `transform_for_pre_decomposition`: there xnnfold's class is "
                  "stock's)" + (": " + ", ".join(f"`{t}`" for t in never) if never else ""),
                  f"- {len(built_other)} constructed only other partitioner classes (executorch's "
                  "subclasses of the stock one, not swapped)",
                  f"- {n_tests - len({short(t) for t in set(constructed) | reached})} constructed "
                  "no XNNPACK partitioner at all (quantizer, serialization, pass-only tests)", ""]

    # -- differences
    if len(results) == 2:
        stock, folded = results["stock"], results["xnnfold"]
        ids = sorted(set(stock) | set(folded))
        differ = [t for t in ids if stock.get(t, {}).get("outcome") != folded.get(t, {}).get("outcome")]
        pass_stock = {t for t in stock if stock[t]["outcome"] == "passed"}
        pass_folded = {t for t in folded if folded[t]["outcome"] == "passed"}
        lines += ["## Tests whose outcome differs", ""]
        if not differ:
            lines += ["None: every test has the same outcome in both modes.", ""]
        else:
            lines += ["| test | stock | xnnfold | xnnfold message |", "|---|---|---|---|"]
            for t in differ:
                s, x = stock.get(t), folded.get(t)
                lines.append(f"| `{t}` | {s['outcome'] if s else 'absent'} | "
                             f"{x['outcome'] if x else 'absent'} | "
                             f"{first_line(x['message']) if x else ''} |")
            lines.append("")
        if pass_stock != pass_folded:
            status = max(status, 1)
            lines += [f"**The sets of passing tests differ**: passed only under stock: "
                      f"{len(pass_stock - pass_folded)}, only under xnnfold: "
                      f"{len(pass_folded - pass_stock)}.", ""]
        else:
            lines += [f"Same {len(pass_stock)} tests pass in both modes.", ""]

    # -- non-passing tests per mode
    lines += ["## Tests not passing", ""]
    for mode in results:
        bad = [(t, r) for t, r in sorted(results[mode].items()) if r["outcome"] != "passed"]
        lines.append(f"{mode}: {len(bad)}" + (":" if bad else ""))
        for t, r in bad:
            lines.append(f"- `{t}`: {r['outcome']}: {first_line(r['message'])}")
        lines.append("")

    # -- swap evidence
    lines += ["## Swap evidence (plugin `conformance/xnnfold_swap.py`)", ""]
    for mode in MODES:
        p = plugin.get(mode)
        if p is None:
            lines += [f"{mode}: no plugin record.", ""]
            continue
        constructed = ", ".join(f"`{k}`: {v}" for k, v in sorted(p["constructed_total"].items()))
        lines.append(f"- {mode}: partitioners constructed, by exact class: {constructed or 'none'}")
        if mode == "xnnfold":
            lines.append(f"- xnnfold: `transform_for_pre_decomposition` ran "
                         f"**{p['hook_calls_total']}** time(s) in {len(p['hook_calls'])} of "
                         f"{p['tests_collected']} tests (raised {p['hook_errors_total']} times); "
                         f"GEMM operands folded: {p['folded_operands_total']}, declined: "
                         f"{p['declined_operands_total']}; fallbacks to stock after an "
                         f"internal failure: {len(p['fallbacks'])}")
            lines.append(f"- xnnfold: `XnnpackPartitioner` replaced in "
                         + ", ".join(f"`{m}`" for m in p["swapped_modules"])
                         + "; bound to xnnfold's class at session end in "
                         + ", ".join(f"`{m}`" for m in p["bound_modules"]["xnnfold"]))
            for fallback in sorted(set(p["fallbacks"])):
                lines.append(f"  - fallback: {first_line(fallback, 300)}")
            folded_tests = {t: sum(r["folded"] for r in rs) for t, rs in p["hook_records"].items()
                            if any(r["folded"] for r in rs)}
            if folded_tests:
                lines.append("- tests in which xnnfold folded at least one operand: "
                             + ", ".join(f"`{t}` ({n})" for t, n in sorted(folded_tests.items())))
            declines = Counter(d for rs in p["hook_records"].values() for r in rs
                               for d in r["declines"])
            for d, n in declines.most_common(10):
                lines.append(f"  - declined ({n}x): {first_line(d, 300)}")
            per_file = defaultdict(int)
            for t, n in p["hook_calls"].items():
                per_file[t.split("::")[0].rsplit("/", 1)[-1]] += n
            lines.append("- hook calls per file: " + ", ".join(
                f"`{f}`: {n}" for f, n in sorted(per_file.items())))
        for problem in p["problems"]:
            status = max(status, 2)
            lines.append(f"- **{mode}: SWAP CHECK FAILED**: {problem}")
    lines.append("")

    # -- torch RNG: does a test leave the generator elsewhere under xnnfold?
    if all(plugin.get(m) and plugin[m].get("rng") for m in MODES):
        rs, rx = plugin["stock"]["rng"], plugin["xnnfold"]["rng"]
        common = [t for t in rs if t in rx]
        same_start = [t for t in common if rs[t].get("start") == rx[t].get("start")]
        moved = [t for t in same_start if rs[t].get("end") != rx[t].get("end")]
        lines += ["## torch RNG state per test", "",
                  f"Same state at the start in both modes: {len(same_start)} of {len(common)} "
                  f"tests; of those, different state at the end (the test drew a different "
                  f"amount of randomness under xnnfold): {len(moved)}"
                  + (": " + ", ".join(f"`{t}`" for t in moved) if moved else "."), ""]

    # -- per-test time, largest xnnfold / stock ratios
    if len(results) == 2:
        both = [t for t in results["stock"] if t in results["xnnfold"]
                and results["stock"][t]["time"] > 0.5]
        ratios = sorted(both, key=lambda t: results["xnnfold"][t]["time"] / results["stock"][t]["time"],
                        reverse=True)[:10]
        lines += ["## Slowest relative to stock (test time xnnfold / stock, tests over 0.5 s)", "",
                  "| test | stock s | xnnfold s | ratio |", "|---|---|---|---|"]
        for t in ratios:
            s, x = results["stock"][t]["time"], results["xnnfold"][t]["time"]
            lines.append(f"| `{t}` | {s:.1f} | {x:.1f} | {x / s:.2f} |")
        lines.append("")

    lines += [f"Exit status of `conformance/run.py`: {status} "
              "(0 same pass sets, 1 pass sets differ, 2 missing results or swap check failed).", ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("both",) + MODES, default="both",
                        help="which mode(s) to run (default both, stock first)")
    parser.add_argument("--summarize", action="store_true",
                        help="do not run pytest; compare the XMLs already in --out")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "conformance")
    parser.add_argument("--suites", default=",".join(DEFAULT_SUITES),
                        help="comma-separated suites, in order (default: all of "
                             + ", ".join(SUITES) + ")")
    parser.add_argument("--files", nargs="+", default=None,
                        help="test files relative to executorch/backends/xnnpack/test/ "
                             "(instead of --suites; one pytest process per mode)")
    parser.add_argument("--threads", default=os.environ.get("CONFORMANCE_THREADS", "1"),
                        help="OMP_NUM_THREADS for the pytest process (default 1: the machine is "
                             "shared; '' leaves it unset)")
    parser.add_argument("--seed", default=os.environ.get("CONFORMANCE_SEED", "0"),
                        help="per-test seed base given to the plugin (--xnnfold-seed), so both "
                             "modes draw the same random weights/inputs in every test; 'none' "
                             "runs the tests unseeded, as shipped (default 0)")
    parser.add_argument("pytest_args", nargs="*",
                        help="extra pytest arguments, after --, e.g. -- -k fp32")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.json"
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    suites = () if args.files else tuple(x for x in args.suites.split(",") if x)
    unknown = [x for x in suites if x not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    if not args.summarize:
        root = test_root()
        seed = None if str(args.seed).lower() == "none" else int(args.seed)
        modes = MODES if args.mode == "both" else (args.mode,)
        jobs = ([(m, f, "") for m in modes for f in [args.files]] if args.files else
                [(m, SUITES[x], x) for x in suites for m in modes])
        for mode, files, tag in jobs:
            key = f"{mode}.{tag}" if tag else mode
            runs[key] = run_mode(mode, root, files, out, args.pytest_args, args.threads, seed, tag)
            runs[key]["seed"] = seed
            runs_path.write_text(json.dumps(runs, indent=1))
            summarize(out, runs, args.files, suites)   # partial results are kept as they come
    return summarize(out, runs, args.files, suites)


if __name__ == "__main__":
    sys.exit(main())
