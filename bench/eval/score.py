#!/usr/bin/env python3
"""Scores generated answers of the evaluation's tasks.

Module: score(eval_obj, output) -> {"success": bool, "detail": str}, where
eval_obj is the "eval" object of a task's generation line (see
bench/eval/workloads/) and output the generated text.

CLI:    python3 bench/eval/score.py IN.jsonl [-o OUT.jsonl] [--jobs 2]
Each input line is a result record with at least "eval" and "output"; it is
written back unchanged plus "success" and "score_detail" (success is null for
a record without "eval"). Progress and a per-family summary go to stderr.

Scorers:
  contains   some answer occurs in the output, both normalized: stripped,
             whitespace collapsed, lower-cased, surrounding quotes/backticks
             and a trailing period removed.
  exact      the normalized output equals some normalized answer.
  call       calls are taken from the output (``` fences allowed, prose
             around them ignored) and parsed with ast.
             Single call (eval "function", "args", "params"; coding): the
             first call must name the function and pass exactly the values
             of "args" in signature order -- positionally, as keywords, or
             mixed, as long as the written order is the signature order.
             Call list (eval "calls", "params", "defaults"; bfcl): the first
             len(calls) calls must match in order by name and keyword values
             (positional arguments named through "params"; strings compared
             stripped of quotes, numbers numerically; a parameter equal to its
             documented default may be given or left out). Later calls are
             ignored: a small model often keeps going to max_new_tokens.
  humaneval  the code (first ``` fence, else the whole output) either
             redefines the entry point -- then it runs after the prompt's
             imports and helpers -- or is a body appended to the prompt (cut
             at HumanEval's stop sequences, re-indented if it is flush left).
             The program plus the test and check(entry_point) runs in a
             sandbox: `python3 -I -S -B` in a fresh temporary directory, its
             own session, empty environment, stdin closed, a 15 s wall clock
             timeout, and a preamble that sets RLIMIT_AS 1 GiB, RLIMIT_CPU
             10 s, RLIMIT_NOFILE 64, RLIMIT_FSIZE 10 MB and installs an audit
             hook refusing writes outside that directory, processes, signals,
             sockets and ctypes. Success: exit status 0.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

HUMANEVAL_TIMEOUT_S = 15.0
HUMANEVAL_CPU_S = 10
HUMANEVAL_MEMORY_BYTES = 1 << 30
HUMANEVAL_FILE_BYTES = 10 << 20
HUMANEVAL_NOFILE = 64


# ---------------------------------------------------------------- contains / exact

_QUOTES = "\"'`"


def normalize(s: str) -> str:
    s = re.sub(r"\s+", " ", str(s)).strip().lower()
    while True:
        before = s
        s = s.rstrip(".").strip()
        if len(s) >= 2 and s[0] == s[-1] and s[0] in _QUOTES:
            s = s[1:-1].strip()
        if s == before:
            return s


def _score_text(ev: dict, output: str, exact: bool) -> dict:
    answers = [a for a in ev.get("answers", []) if normalize(a)]
    if not answers:
        return {"success": False, "detail": "eval has no answers"}
    out = normalize(output)
    for a in answers:
        if (out == normalize(a)) if exact else (normalize(a) in out):
            return {"success": True, "detail": f"matched {a!r}"}
    return {"success": False, "detail": f"expected {'exactly ' if exact else ''}{answers[0]!r}"}


# ---------------------------------------------------------------- call

_CALL_START = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\(")
_DECL = re.compile(r"(?:\bdef|\bfunction|\bclass|\bnew)\s+$")
_JS_CONSTANTS = {"true": True, "false": False, "null": None, "None": None}


def extract_calls(output: str, limit: int = 16) -> list[ast.Call]:
    """Calls written in output, outermost only, in order of appearance."""
    text = "\n".join(l for l in output.split("\n") if not l.lstrip().startswith("```"))
    calls, pos = [], 0
    while len(calls) < limit:
        m = _CALL_START.search(text, pos)
        if not m:
            break
        if _DECL.search(text[max(0, m.start() - 12):m.start()]):
            pos = m.end()
            continue
        call, end = None, m.end()
        # The shortest balanced span that parses is the call.
        for close in (i for i, ch in enumerate(text[m.end() - 1:], m.end() - 1) if ch == ")"):
            try:
                node = ast.parse(text[m.start():close + 1].strip(), mode="eval").body
            except SyntaxError:
                if close - m.start() > 4000:
                    break
                continue
            if isinstance(node, ast.Call):
                call, end = node, close + 1
            break
        if call is not None:
            calls.append(call)
            pos = end
        else:
            pos = m.end()
    return calls


def _call_name(call: ast.Call) -> str:
    try:
        return ast.unparse(call.func)
    except Exception:  # noqa: BLE001 - any odd node is just "no name"
        return ""


def _same_name(written: str, expected: str) -> bool:
    return written == expected or written.rsplit(".", 1)[-1] == expected


def _literal(node: ast.AST):
    """(True, value) for a literal (JS true/false/null included), else (False, None)."""
    if isinstance(node, ast.Name) and node.id in _JS_CONSTANTS:
        return True, _JS_CONSTANTS[node.id]
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def values_match(expected, got) -> bool:
    """Loose equality of argument values: numbers numerically, strings stripped of quotes."""
    if isinstance(expected, bool) or isinstance(got, bool):
        if isinstance(expected, bool) and isinstance(got, bool):
            return expected == got
        other, b = (got, expected) if isinstance(expected, bool) else (expected, got)
        return isinstance(other, str) and other.strip().strip(_QUOTES).lower() == str(b).lower()
    if expected is None or got is None:
        return (expected in (None, "None")) and (got in (None, "None"))
    if _num(expected) or _num(got):
        try:
            a, b = float(expected), float(got)
        except (TypeError, ValueError):
            return False
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(expected, str) and isinstance(got, str):
        return expected.strip().strip(_QUOTES) == got.strip().strip(_QUOTES)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(expected) == len(got) and all(values_match(a, b) for a, b in zip(expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return (sorted(map(str, expected)) == sorted(map(str, got)) and
                all(values_match(expected[k], got.get(k, got.get(str(k)))) for k in expected))
    return expected == got


def _source_match(expected_src: str, node: ast.AST) -> bool:
    """An argument against the source text of the expected argument."""
    try:
        exp_node = ast.parse(expected_src.strip(), mode="eval").body
    except SyntaxError:
        return ast.unparse(node).strip() == expected_src.strip()
    ok_e, ve = _literal(exp_node)
    ok_g, vg = _literal(node)
    if ok_e and ok_g:
        # 0.1 and 0.10 are the same argument; '0.1' and 0.1 are not.
        if _num(ve) and _num(vg):
            return values_match(ve, vg)
        return type(ve) is type(vg) and values_match(ve, vg)
    if ok_e != ok_g:
        return False
    return ast.dump(exp_node) == ast.dump(node)


def _score_single_call(ev: dict, output: str) -> dict:
    fn, args, params = ev["function"], ev["args"], ev.get("params") or []
    calls = extract_calls(output, limit=1)
    if not calls:
        return {"success": False, "detail": "no call in output"}
    call = calls[0]
    name = _call_name(call)
    if not _same_name(name, fn):
        return {"success": False, "detail": f"first call is {name}, expected {fn}"}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return {"success": False, "detail": "*args/**kwargs in call"}
    written = [(params[i] if i < len(params) else None, a) for i, a in enumerate(call.args)]
    written += [(k.arg, k.value) for k in call.keywords]
    if len(written) != len(args):
        return {"success": False, "detail": f"{len(written)} arguments, expected {len(args)}"}
    for i, (pname, node) in enumerate(written):
        if params and pname != params[i]:
            return {"success": False, "detail": f"argument {i + 1} is {pname}, expected {params[i]}"}
        if not _source_match(args[i], node):
            return {"success": False,
                    "detail": f"argument {i + 1} is {ast.unparse(node)}, expected {args[i]}"}
    return {"success": True, "detail": f"{ast.unparse(call)}"}


def _kwargs_of(call: ast.Call, params: list[str]):
    """{name: value} of a call, or (None, reason)."""
    out = {}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None, "*args/**kwargs in call"
    if len(call.args) > len(params):
        return None, f"{len(call.args)} positional arguments, at most {len(params)} known"
    pairs = [(params[i], a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords]
    for name, node in pairs:
        if name in out:
            return None, f"{name} given twice"
        ok, v = _literal(node)
        out[name] = v if ok else ast.unparse(node)
    return out, ""


def _score_call_list(ev: dict, output: str) -> dict:
    expected = ev["calls"]
    params, defaults = ev.get("params", {}), ev.get("defaults", {})
    calls = extract_calls(output, limit=len(expected))
    if len(calls) < len(expected):
        return {"success": False, "detail": f"{len(calls)} calls in output, expected {len(expected)}"}
    for i, (exp, call) in enumerate(zip(expected, calls)):
        name = _call_name(call)
        if not _same_name(name, exp["function"]):
            return {"success": False, "detail": f"call {i + 1} is {name}, expected {exp['function']}"}
        got, why = _kwargs_of(call, params.get(exp["function"], list(exp["kwargs"])))
        if got is None:
            return {"success": False, "detail": f"call {i + 1}: {why}"}
        dflt = defaults.get(exp["function"], {})
        for k, v in exp["kwargs"].items():
            if k in got:
                if not values_match(v, got[k]):
                    return {"success": False, "detail": f"call {i + 1}: {k}={got[k]!r}, expected {v!r}"}
            elif not (k in dflt and values_match(v, dflt[k])):
                return {"success": False, "detail": f"call {i + 1}: missing {k}"}
        for k, v in got.items():
            if k not in exp["kwargs"] and not (k in dflt and values_match(dflt[k], v)):
                return {"success": False, "detail": f"call {i + 1}: unexpected {k}={v!r}"}
    return {"success": True, "detail": f"{len(expected)} calls match"}


# ---------------------------------------------------------------- humaneval

# Runs first in the candidate's interpreter: resource limits, then an audit
# hook (hooks cannot be removed once added). The limits are set here rather
# than in a preexec_fn, which is not safe with the CLI's worker threads.
# Paths are made absolute without touching the file system, and links are
# refused, so a path cannot leave the directory.
_GUARD = r'''
def _polykv_guard():
    import os as _os, sys as _sys, resource as _resource
    for res, soft, hard in ((_resource.RLIMIT_AS, {mem}, {mem}),
                            (_resource.RLIMIT_CPU, {cpu}, {cpu} + 1),
                            (_resource.RLIMIT_NOFILE, {nofile}, {nofile}),
                            (_resource.RLIMIT_FSIZE, {fsize}, {fsize}),
                            (_resource.RLIMIT_CORE, 0, 0)):
        _resource.setrlimit(res, (soft, hard))
    root = _os.getcwd()
    deny = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
            "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
            "socket.getaddrinfo", "ctypes.", "os.symlink", "os.link", "os.chown", "os.chroot",
            "os.setuid", "resource.setrlimit", "resource.prlimit", "webbrowser.open")
    path_events = ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.truncate", "os.chmod",
                   "os.utime", "os.chflags", "os.mkfifo", "os.mknod", "shutil.rmtree",
                   "shutil.copyfile", "shutil.move", "os.removexattr", "os.setxattr")
    W = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | _os.O_TRUNC
    def inside(p):
        if isinstance(p, int):
            return True
        if isinstance(p, bytes):
            p = p.decode("utf-8", "replace")
        p = _os.path.normpath(_os.path.join(root, _os.fspath(p)))
        return p == root or p.startswith(root + _os.sep)
    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & W)
            if writing and not inside(path):
                raise PermissionError("sandbox: write outside the working directory")
        elif event == "import" and args and args[0] in ("ctypes", "_ctypes"):
            raise PermissionError("sandbox: ctypes")
        elif event.startswith(deny):
            raise PermissionError("sandbox: " + event)
        elif event.startswith(path_events):
            for a in args:
                if isinstance(a, (str, bytes, _os.PathLike)) and not inside(a):
                    raise PermissionError("sandbox: " + event + " outside the working directory")
    _sys.addaudithook(hook)
_polykv_guard()
del _polykv_guard
'''


def guard(cpu_s: int) -> str:
    return (_GUARD.replace("{mem}", str(HUMANEVAL_MEMORY_BYTES)).replace("{cpu}", str(cpu_s))
            .replace("{nofile}", str(HUMANEVAL_NOFILE)).replace("{fsize}", str(HUMANEVAL_FILE_BYTES)))


_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```")


def extract_code(output: str) -> str:
    m = re.search(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)(?:```|\Z)", output, re.S)
    return m.group(1) if m else output


def build_program(ev: dict, output: str) -> str:
    prompt, entry = ev["prompt"], ev["entry_point"]
    code = extract_code(output)
    redefines = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M)
    if redefines:
        head = re.search(rf"^def\s+{re.escape(entry)}\s*\(", prompt, re.M)
        program = (prompt[:head.start()] if head else "") + "\n" + code
    else:
        body = code
        for stop in _STOPS:
            i = body.find(stop)
            if i >= 0:
                body = body[:i]
        lines = body.split("\n")
        first = next((l for l in lines if l.strip()), "")
        if first and not first[0].isspace():
            # A body written flush left belongs inside the function.
            body = "\n".join(("    " + l) if l.strip() else l for l in lines)
        program = prompt + body
    return program + "\n\n" + ev["test"] + f"\n\ncheck({entry})\n"


def run_sandboxed(program: str, timeout_s: float = HUMANEVAL_TIMEOUT_S,
                  cpu_s: int = HUMANEVAL_CPU_S) -> tuple[bool, str]:
    """Runs program in the sandbox; (it ran to the end and exited 0, detail)."""
    # Printed after the program, so that an early sys.exit(0) or os._exit(0)
    # in the candidate is not mistaken for passing tests.
    sentinel = "polykv-done-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="polykv-score-") as tmp:
        work = os.path.join(tmp, "work")  # the candidate may write here only
        os.mkdir(work)
        path = os.path.join(work, "candidate.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(guard(cpu_s) + "\n" + program + f"\nprint({sentinel!r})\n")
        # Output goes to files outside work (RLIMIT_FSIZE caps them), not to
        # pipes that a printing loop could fill with gigabytes.
        with open(os.path.join(tmp, "out"), "w+b") as out, open(os.path.join(tmp, "err"), "w+b") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", path], cwd=work, env={},
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, close_fds=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                return False, f"timeout after {timeout_s:g} s"
            out.seek(max(0, os.fstat(out.fileno()).st_size - 4096))
            stdout = out.read().decode("utf-8", "replace")
            err.seek(max(0, os.fstat(err.fileno()).st_size - 4096))
            stderr = err.read().decode("utf-8", "replace")
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        why = {"SIGXCPU": " (cpu limit)", "SIGKILL": " (cpu limit)", "SIGXFSZ": " (file size limit)"}
        return False, f"killed by {sig}{why.get(sig, '')}"
    if proc.returncode == 0 and sentinel in stdout:
        return True, "passed"
    if proc.returncode == 0:
        return False, "exited before the tests finished"
    tail = stderr.strip().split("\n")
    return False, f"exit {proc.returncode}: {tail[-1][:300] if tail else ''}"


def _score_humaneval(ev: dict, output: str, timeout_s: float, cpu_s: int) -> dict:
    ok, detail = run_sandboxed(build_program(ev, output), timeout_s, cpu_s)
    return {"success": ok, "detail": detail}


# ---------------------------------------------------------------- entry points

def score(eval_obj: dict, output: str, *, timeout_s: float = HUMANEVAL_TIMEOUT_S,
          cpu_s: int = HUMANEVAL_CPU_S) -> dict:
    """{"success": bool, "detail": str} of output against a task's eval object."""
    output = output or ""
    scorer = eval_obj.get("scorer")
    try:
        if scorer == "contains":
            return _score_text(eval_obj, output, exact=False)
        if scorer == "exact":
            return _score_text(eval_obj, output, exact=True)
        if scorer == "call":
            if "calls" in eval_obj:
                return _score_call_list(eval_obj, output)
            return _score_single_call(eval_obj, output)
        if scorer == "humaneval":
            return _score_humaneval(eval_obj, output, timeout_s, cpu_s)
    except (KeyError, TypeError) as e:
        return {"success": False, "detail": f"malformed eval object: {e!r}"}
    return {"success": False, "detail": f"unknown scorer {scorer!r}"}


def score_record(rec: dict) -> dict:
    ev = rec.get("eval")
    out = dict(rec)
    if not isinstance(ev, dict):
        out["success"], out["score_detail"] = None, "no eval object"
        return out
    r = score(ev, rec.get("output") or "")
    out["success"], out["score_detail"] = r["success"], r["detail"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="result records, JSONL ('-' for stdin)")
    ap.add_argument("-o", "--output", help="write scored records here (default stdout)")
    ap.add_argument("--jobs", type=int, default=2, help="records scored in parallel (default 2)")
    args = ap.parse_args(argv)
    src = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    with src:
        lines = [l for l in src if l.strip()]
    records = []
    for i, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            print(f"score: error: {args.input}:{i}: {e}", file=sys.stderr)
            return 1
    done, lock = [0], threading.Lock()

    def one(rec):
        r = score_record(rec)
        with lock:
            done[0] += 1
            if done[0] % 25 == 0 or done[0] == len(records):
                print(f"score: {done[0]}/{len(records)}", file=sys.stderr)
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        scored = list(pool.map(one, records))
    dst = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for r in scored:
            dst.write(json.dumps(r) + "\n")
    finally:
        if args.output:
            dst.close()
    by_family: dict = {}
    for r in scored:
        if r["success"] is None:
            continue
        fam = r["eval"].get("family", "?")
        n, k = by_family.get(fam, (0, 0))
        by_family[fam] = (n + 1, k + bool(r["success"]))
    for fam, (n, k) in sorted(by_family.items()):
        print(f"score: {fam}: {k}/{n} succeeded", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
