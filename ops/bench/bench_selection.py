"""Benchmark: resolve the subject of one commit that touches N files (default 10,000).

    .venv/bin/python -m ops.bench.bench_selection [--files 10000] [--repeat 3] [--mode content]

Builds a throwaway repository with `git fast-import` (a small base commit, then one commit
adding N files: mostly text in several languages, binaries, files marked generated/vendored/
binary by `.gitattributes`, secret files at various depths, lockfiles and minified bundles,
a few symlinks), then times `resolve_subject` on that commit with no file paths (the
changed-set case a CI gate runs). Prints time per 1,000 files against the 1 s target, git
process count, Python peak heap (tracemalloc, measured in a separate run so it does not
distort the timing) and the peak RSS of this process. (Children's peak RSS is not shown:
on Linux a forked child is charged its parent's memory before it execs git.)
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from shared.selection import resolve_subject
from shared.settings import CouncilSettings

TARGET_S_PER_1000 = 1.0

GITATTRIBUTES = b"""\
gen/** linguist-generated
*.pb.go linguist-generated=true
third_party/** linguist-vendored
*.dat binary
*.raw -text
"""


def _file(i: int, rng: random.Random) -> tuple[str, str, bytes]:
    """(mode, path, content) for the i-th generated file."""
    d = f"pkg{i % 97}/sub{i % 7}"
    kind = i % 20
    body = "".join(f"line {n} of file {i}: value = {rng.randint(0, 10**6)}\n" for n in range(30))
    if kind < 10:
        ext = (".py", ".ts", ".go", ".md", ".zig", ".tf", ".rs", ".java", ".txt", "")[kind]
        name = f"{d}/mod{i}{ext}" if ext else f"{d}/Script{i}"
        return "100644", name, body.encode()
    if kind == 10:
        return "100644", f"{d}/blob{i}.bin", bytes(rng.randrange(256) for _ in range(1500))
    if kind == 11:
        return "100644", f"gen/{d}/gen{i}.py", body.encode()
    if kind == 12:
        return "100644", f"{d}/api{i}.pb.go", body.encode()
    if kind == 13:
        return "100644", f"third_party/{d}/lib{i}.c", body.encode()
    if kind == 14:
        return "100644", f"{d}/data{i}.dat", body.encode()
    if kind == 15:
        secret = (".env", "server.pem", "id_rsa", ".ENV.production", "secrets.yaml", "x.p12")
        return "100644", f"{d}/s{i}/{secret[i % len(secret)]}", f"TOKEN={i}\n".encode()
    if kind == 16:
        noise = ("package-lock.json", "yarn.lock", "app.min.js", "go.sum")
        return "100644", f"{d}/n{i}/{noise[i % len(noise)]}", body.encode()
    if kind == 17:
        return "100644", f"node_modules/m{i}/index.js", body.encode()
    if kind == 18:
        return "120000", f"{d}/link{i}", b"../../README.md"
    return "100755", f"{d}/tool{i}.sh", ("#!/bin/sh\n" + body).encode()


def build_repo(path: Path, files: int, seed: int = 7) -> str:
    """Create the repository at `path`; return the sha of the commit touching `files` files."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    rng = random.Random(seed)
    out = bytearray()

    def data(payload: bytes) -> None:
        out.extend(b"data %d\n" % len(payload))
        out.extend(payload)
        out.extend(b"\n")

    def commit(ref_mark: int, message: bytes, parent: int | None) -> None:
        out.extend(b"commit refs/heads/main\nmark :%d\n" % ref_mark)
        out.extend(b"author Bench <bench@example.com> 1700000000 +0000\n")
        out.extend(b"committer Bench <bench@example.com> 1700000000 +0000\n")
        data(message)
        if parent is not None:
            out.extend(b"from :%d\n" % parent)

    commit(1, b"base", None)
    out.extend(b"M 100644 inline README.md\n")
    data(b"# bench\n")
    commit(2, b"touch many files", 1)
    out.extend(b"M 100644 inline .gitattributes\n")
    data(GITATTRIBUTES)
    for i in range(files - 1):
        mode, name, content = _file(i, rng)
        out.extend(f"M {mode} inline {name}\n".encode())
        data(content)
    out.extend(b"\n")
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=bytes(out), check=True)
    subprocess.run(["git", "-C", str(path), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    sha = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "main"], capture_output=True, check=True, text=True
    ).stdout.strip()
    return sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mode", choices=("content", "allowlist", "shadow"), default="content")
    args = parser.parse_args(argv)

    settings = CouncilSettings(file_selection=args.mode, state_dir=Path(".council"))
    with tempfile.TemporaryDirectory(prefix="bench-selection-") as tmp:
        repo = Path(tmp) / "repo"
        t0 = time.perf_counter()
        sha = build_repo(repo, args.files)
        build_s = time.perf_counter() - t0

        times = []
        subject = None
        for _ in range(args.repeat):
            t = time.perf_counter()
            subject = resolve_subject(repo, sha, None, settings=settings)
            times.append(time.perf_counter() - t)
        assert subject is not None

        tracemalloc.start()
        resolve_subject(repo, sha, None, settings=settings)
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    best, median = min(times), statistics.median(times)
    per_1000 = median / args.files * 1000
    cov = subject.coverage
    reasons: dict[str, int] = {}
    for o in cov.omitted:
        reasons[o.reason] = reasons.get(o.reason, 0) + 1
    print(f"files touched by the commit : {args.files} (repo built in {build_s:.2f} s)")
    print(f"selection mode              : {args.mode}")
    print(f"reviewed / omitted          : {len(cov.reviewed)} / {len(cov.omitted)} {reasons}")
    print(f"subject size                : {subject.total_chars:,} characters")
    print(f"resolve_subject             : best {best:.3f} s, median {median:.3f} s")
    print(
        f"time per 1,000 files        : {per_1000:.3f} s "
        f"(target < {TARGET_S_PER_1000:.1f} s; ratio {per_1000 / TARGET_S_PER_1000:.2f})"
    )
    print(f"python peak heap            : {peak / 2**20:.1f} MiB (tracemalloc)")
    print(f"peak RSS of this process    : {self_rss:.0f} MiB (includes the interpreter)")
    return 0 if per_1000 < TARGET_S_PER_1000 else 1


if __name__ == "__main__":
    sys.exit(main())
