"""What the parity scripts share: their arguments, the upstream checkout on the import path, its commit, the JSON."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def arguments(work: bool = True) -> argparse.Namespace:
    """--upstream (a checkout of the family's repository), --deps (a `pip install --target` folder of what its code
    imports beyond torch and transformers), --work (where upstream's files are saved), --json (the results); the
    checkout and the deps go first on the import path, this repository last."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--deps", required=True)
    if work:
        parser.add_argument("--work", required=True, help="folder for the files upstream saves")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    sys.path[:0] = [args.deps, args.upstream]
    sys.path.append(str(REPOSITORY))
    return args


def upstream_commit(args: argparse.Namespace) -> str:
    return subprocess.run(["git", "-C", args.upstream, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def write(results: dict, args: argparse.Namespace) -> None:
    with open(args.json, "w") as file:
        json.dump(results, file, indent=1)
    print(json.dumps(results))
