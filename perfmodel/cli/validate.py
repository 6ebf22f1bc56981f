"""``perfmodel validate``: predict the published measurements, MAPE per source."""
from __future__ import annotations

import sys

from topologies.clikit import atomic_write, check_writable, dump_json, table


def add_validate(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements (validation/published): MAPE per source",
                       description="Predict every row of the published tables in validation/published (sources.toml "
                       "names them; README.md there gives each row's source and conditions) and print, per source, "
                       "MAPE, bias, the worst row and the table of measured against predicted.")
    v.add_argument("--published", nargs="?", const="all", default="all", metavar="SOURCE",
                   help="one source key of sources.toml, or all (default)")
    v.add_argument("--dir", help="folder of the tables (default: the repository's validation/published): its "
                   "sources.toml names each source's CSV table (a file inside the folder), bounds.json (optional) "
                   "each source's MAPE bound; a malformed entry, cell or bound is refused in one line naming the "
                   "file, the line or key, and the column")
    v.add_argument("--by", metavar="KEY,KEY",
                   help="also group each source's rows by their regime and print MAPE, bias and the worst row per "
                   "group: keys among model, cluster, precision, framework, gpus, op (e.g. --by model,cluster; "
                   "with --json each source gains 'regimes'); the per-row tables are then left out")
    v.add_argument("--json", action="store_true", help="JSON: per source its summary and rows")
    v.add_argument("--csv", metavar="FILE", help="write every row (source, measured, predicted, error) as CSV")
    v.add_argument("--plot", metavar="FILE.png", help="draw predicted against measured (.png, .svg or .pdf)")
    v.add_argument("--check-bounds", action="store_true",
                   help="exit 1 if a source's MAPE is above its bound in bounds.json (or is not a number), or a "
                        "measured run's plan is predicted not to fit its GPUs' memory; each bound a finite number "
                        "from 0 to 10 (0.05 is 5%%)")


def run_validate(args) -> None:
    import csv
    import io
    from pathlib import Path

    from perfmodel.calibration import published as pub
    from perfmodel.calibration import regimes
    from perfmodel.report.plots import check_picture

    folder = Path(args.dir) if args.dir else pub.PUBLISHED_DIR
    if args.csv:
        check_writable(args.csv, "csv")
    check_picture(args.plot)
    bounds = pub.load_bounds(folder)    # a malformed bound is refused before anything is predicted
    keys = regimes.parse_keys(args.by) if args.by else ()
    reports = pub.validate_published(args.published, folder)
    if keys:
        reports = [dict(r, regimes=regimes.by_regime(r["results"], keys)) for r in reports]
    if args.csv:
        buffer = io.StringIO()
        csv.writer(buffer).writerows(pub.results_csv_rows(reports))
        atomic_write(args.csv, lambda h: h.write(buffer.getvalue().encode()))
    if args.plot:
        pub.plot_published(reports, args.plot)
    if args.json:
        print(dump_json([dict(r, bound=bounds.get(r["source"])) for r in reports]))
    elif keys:
        _regime_report(reports, bounds, keys)
    else:
        _validate_report(reports, bounds)
    bad = pub.check_bounds(reports, bounds) if args.check_bounds else []
    if bad:
        print("\n".join(bad), file=sys.stderr)
        raise SystemExit(1)


def _validate_report(reports, bounds) -> None:
    from perfmodel.calibration.published import summary_markdown

    print(summary_markdown(reports, bounds))
    for rep in reports:
        rows = [(r.label, r.measured, "-" if r.predicted is None else round(r.predicted, 1),
                 "-" if r.error is None else f"{r.error:+.1%}", _memory_cell(r), r.skipped) for r in rep["results"]]
        unit = rep["results"][0].unit if rep["results"] else ""
        print()
        print(table(("row", f"measured {unit}", "predicted", "error", "memory/GPU", "skipped"), rows,
                    title=f"# {rep['source']}: {rep['title']}"))


def _regime_report(reports, bounds, keys) -> None:
    """The summary, then per source its rows' groups by ``keys`` (``perfmodel.calibration.regimes``)."""
    from perfmodel.calibration.published import summary_markdown

    print(summary_markdown(reports, bounds))
    for rep in reports:
        rows = [(*(g[k] for k in keys), g["rows"], f"{g['mape']:.1%}", f"{g['bias']:+.1%}",
                 f"{g['worst_label']} ({g['worst_error']:+.1%})") for g in rep["regimes"]]
        print()
        print(table((*keys, "rows", "MAPE", "bias", "worst row"), rows,
                    title=f"# {rep['source']} by {', '.join(keys)}: {rep['title']}"))


def _memory_cell(row) -> str:
    """A training row's predicted memory per GPU, flagged where it would not fit (it ran)."""
    if row.memory_GiB is None:
        return "-"
    return f"{row.memory_GiB:.1f} GiB" + ("" if row.fits else " DOES NOT FIT")


COMMANDS = {"validate": (add_validate, run_validate)}
