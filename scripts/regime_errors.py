#!/usr/bin/env python3
"""Write perfmodel/catalog/regime_errors.json: the model's error on the published training runs of
``perfmodel validate --published``, grouped by regime (cluster and model family, GPU and family,
family, all), which ``perfmodel advise`` turns into a speedup's uncertainty band
(``perfmodel.explore.uncertainty``). The file is generated, never hand-edited; ``--check`` only
compares (exit 1 if it is stale), as tests/perfmodel/test_advise.py does.

    python scripts/regime_errors.py [--check]
"""
from __future__ import annotations

import argparse
import json
import sys

from perfmodel.calibration.published import validate_published
from perfmodel.explore.uncertainty import REGIME_FILE, regime_table


def generated() -> dict:
    return regime_table(validate_published())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated table")
    args = p.parse_args(argv)
    table = generated()
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if args.check:
        if REGIME_FILE.read_text() != text:
            print(f"{REGIME_FILE.name} is stale: run scripts/regime_errors.py", file=sys.stderr)
            return 1
        return 0
    REGIME_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
