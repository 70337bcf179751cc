"""python -m cs336_systems.experiments.answers REPORT_DIR: rebuild a report's answers from its tables."""

import argparse
import sys

from cs336_systems.experiments.answers import rebuild


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336_systems.experiments.answers", description=__doc__)
    p.add_argument("report_dir", help="a report folder, e.g. reports/gpu")
    args = p.parse_args(argv)
    built = rebuild(args.report_dir)
    missing = [k for k, a in built.items() if not a.answered]
    print(f"{len(built)} answers rebuilt; {len(missing)} not answered" + (f": {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
