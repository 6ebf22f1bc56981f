"""``perfmodel calibrate``: fit a calibration profile from measured records."""
from __future__ import annotations

from perfmodel.cli.common import RAW
from topologies.clikit import atomic_write, check_writable, dump_json, table
from topologies.errors import InputError

CALIBRATE_EPILOG = """examples:
  realrun bench kernels --sizes 1MiB:64MiB --compressors int8,sz3 --json kernels.jsonl
  perfmodel calibrate kernels.jsonl collectives.jsonl --cluster emulated:hosts=4,bandwidth=1gbit -o profile.json
  perfmodel collective allreduce --cluster emulated:hosts=4,bandwidth=1gbit --size 64MiB \
      --compressor none,int8 --calibration profile.json
"""


def add_calibrate(sub) -> None:
    cal = sub.add_parser("calibrate", help="fit a calibration profile from measured records",
                         description="Fit alpha, beta and base latency per tier class (uncompressed collective "
                         "records), kernel throughput per compressor and direction and the launch cost "
                         "(kernel records), and measured ratios of data-dependent specs; scipy least squares "
                         "with a robust loss. Prints residuals and R^2; writes a versioned profile that every "
                         "perfmodel command takes with --calibration.", epilog=CALIBRATE_EPILOG,
                         formatter_class=RAW)
    cal.add_argument("records", nargs="+", help="JSON Lines files written by realrun bench --json; every field of "
                     "every record is checked (its type and declared bound, and no record a fit cannot use: a kernel "
                     "record of 0 bytes or 0 wire bytes, times implying a rate past any device's), one line naming "
                     "the file, line and field")
    cal.add_argument("-o", "--output", required=True, help="the profile to write (JSON, atomically; only once "
                     "every fitted value is within its declared bound, as perfmodel checks a profile it reads)")
    cal.add_argument("--cluster", help="cluster the collective records ran on, where a record does not name it "
                     "(e.g. emulated:hosts=4,bandwidth=1gbit)")
    cal.add_argument("--json", action="store_true", help="print the profile instead of the summary table")


def run_calibrate(args) -> None:
    import json

    from perfmodel.calibration.fit import fit_profile, summary, worst_residuals
    from perfmodel.calibration.measurements import read_records

    check_writable(args.output, "output")
    records = [r for path in args.records for r in read_records(path)]
    cluster = args.cluster or next((r["cluster"] for r in records if "cluster" in r), None)
    if cluster is None:
        raise InputError("cluster", None, "--cluster NAME (the records do not name the cluster they ran on)")
    profile = fit_profile(records, cluster, sources=args.records)
    atomic_write(args.output, lambda h: h.write(json.dumps(profile, indent=1).encode()))
    if args.json:
        print(dump_json(profile))
        return
    print(f"# perfmodel calibrate: {len(records)} records -> {args.output} (cluster {cluster})")
    print(table(("fitted", "value", "fit"), summary(profile)))
    print()
    print(table(("cluster", "algorithm", "size", "measured_s", "fitted_s", "residual"), worst_residuals(profile),
                title="# largest residuals of the tier fit (all are in the profile under fits)"))


COMMANDS = {"calibrate": (add_calibrate, run_calibrate)}
