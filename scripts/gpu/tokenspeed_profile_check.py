"""On a GPU host with TokenSpeed installed: confirm the CPU stand-in's fidelity against the real server.

What it does, with the product's own code (no VERL, no hub download):

1. builds a tiny random-weight Qwen2 + byte-level tokenizer locally (``tests/verl_e2e/assets.py``);
2. starts a REAL ``tokenspeed serve`` on it through the rollout's launcher (``--enforce-eager``:
   Proton under CUDA graphs fails upstream in 0.1.1), Proton's Chrome-trace env set by the launcher;
3. opens one profile window with VIZTRACER + PROTON (``ProfileControl``, exactly what a VERL
   profiled step does), sends a few ``/generate`` requests with ``rid``s, stops it, waits for every
   file of every TP rank and registers them in process records;
4. asserts what the stand-in assumes: files named ``<timestamp>-TP<r>.viztracer.json`` /
   ``.proton.chrome_trace`` (``profile_id`` dropped), Proton with top-level ``baseTimeNanoseconds``,
   a ``viztracer->proton`` flow start per Proton scope, real logprobs;
5. runs ``rl-trace merge`` and loads the result in the offline Perfetto engine: zero import errors,
   every rank's VizTracer and Proton lanes in its own process, every scope link kept.

Usage (from the repository root, TokenSpeed 0.1.1 + kernels + this package installed in one env):
    python scripts/gpu/tokenspeed_profile_check.py OUT_DIR [--tp N] \
        [--command "python -m tokenspeed.cli serve"]
Exit code 0 when every check holds; each failed check prints one line.

Dry run without a GPU, against the tests' CPU stand-in (checks the script, not TokenSpeed):
    PYTHONPATH=. .venv/bin/python scripts/gpu/tokenspeed_profile_check.py /tmp/out --tp 2 \
        --command ".venv-tokenspeed/bin/python -m tests.tokenspeed_standin serve"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rl_trace_observer import config as config_mod  # noqa: E402
from rl_trace_observer.capture import configure  # noqa: E402
from rl_trace_observer.integrations.tokenspeed.http import ControlClient  # noqa: E402
from rl_trace_observer.integrations.tokenspeed.launcher import ServerProcess, ServeSpec, free_port, server_env  # noqa: E402
from rl_trace_observer.integrations.tokenspeed.profiling import ProfileControl  # noqa: E402

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILED.append(what)


async def profile_window(args: argparse.Namespace, out: Path, model: Path) -> Path:
    activities = ("VIZTRACER", "PROTON")
    spec = ServeSpec(
        model=str(model),
        tp=args.tp,
        port=free_port(),
        control_port=free_port(),
        host="127.0.0.1",
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_num_seqs=16,
        command=shlex.split(args.command),
        env=server_env(activities, os.environ.get("CUDA_VISIBLE_DEVICES")),
    )
    server = ServerProcess(spec, "gpu_check")
    server.start()
    client = ControlClient(f"http://127.0.0.1:{spec.control_port}")
    try:
        await server.wait_healthy(client, 1800)
        control = ProfileControl(client, replica=0, ranks=args.tp, activities=activities, stall_timeout_s=300)
        check(await control.start(1), "/start_profile with VIZTRACER,PROTON accepted")
        for i in range(4):
            body = {
                "rid": f"gpu-check-{i}",
                "input_ids": [5, 6, 7, 8],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 16, "temperature": 1.0},
            }
            status, reply = await client.post("/generate", body)
            meta = (reply or {}).get("meta_info", {}) if isinstance(reply, dict) else {}
            check(status == 200 and meta.get("id") == f"gpu-check-{i}", f"/generate keeps rid gpu-check-{i}")
            lps = [p[0] for p in meta.get("output_token_logprobs") or []]
            check(bool(lps) and any(lp != 0.0 for lp in lps), "real logprobs (--enable-output-logprobs)")
        window = await control.stop()
        await control.wait(600)
        control.close()
        assert window is not None
        return window.directory
    finally:
        await client.close()
        print(f"server log: {server.log_path}")
        server.terminate()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--command", default=f"{sys.executable} -m tokenspeed.cli serve")
    args = p.parse_args()
    out = args.out.resolve()
    from tests.verl_e2e.assets import build_model, build_tokenizer

    model = out / "tiny-qwen2"
    model.mkdir(parents=True, exist_ok=True)
    build_model(model, build_tokenizer(model))
    configure(config_mod.load({"RL_TRACE_OUTPUT_DIR": str(out / "trace"), "RL_TRACE_RUN_ID": "gpu-check"}))
    directory = asyncio.run(profile_window(args, out, model))
    names = sorted(f.name for f in directory.iterdir())
    print("files:", names)
    for r in range(args.tp):
        viz = [n for n in names if n.endswith(f"-TP{r}.viztracer.json")]
        proton = [n for n in names if f"-TP{r}.proton" in n and n.endswith(".chrome_trace")]
        check(
            len(viz) == 1 and len(proton) >= 1, f"TP{r}: one VizTracer report and Proton chrome_trace file(s)"
        )
        if viz and proton:
            check(viz[0].split("-TP")[0][:8].isdigit(), f"TP{r}: profile_id is TokenSpeed's timestamp")
            doc = json.loads((directory / proton[0]).read_text())
            check(isinstance(doc.get("baseTimeNanoseconds"), int), f"TP{r}: Proton has baseTimeNanoseconds")
            scopes = sum(
                1 for e in doc["traceEvents"] if e.get("cat") == "scope" and "scope_id" in e.get("args", {})
            )
            vdoc = json.loads((directory / viz[0]).read_text())
            starts = sum(
                1 for e in vdoc["traceEvents"] if e.get("name") == "viztracer->proton" and e.get("ph") == "s"
            )
            check(
                scopes > 0 and starts >= scopes,
                f"TP{r}: {starts} viztracer->proton starts for {scopes} scopes",
            )
    merged = out / "merged.json"
    proc = subprocess.run([sys.executable, "-m", "rl_trace_observer.cli.main", "merge", str(out / "trace"),
                           "-o", str(merged)], capture_output=True, text=True)  # fmt: skip
    check(proc.returncode == 0, f"rl-trace merge ({proc.stderr.strip()[-300:]})")
    manifest = json.loads(Path(f"{merged}.manifest.json").read_text())
    bad = [p for p in manifest["problems"] if "tokenspeed" in str(p.get("path", ""))]
    check(not bad, f"no manifest problem for the profile files ({bad[:3]})")
    from rl_trace_observer.testing.perfetto.engine import Engine, unavailable_reason

    reason = unavailable_reason()
    if reason:
        check(False, f"Perfetto engine available ({reason}); or run ../shared/tools/perfetto-check {merged}")
    else:
        with Engine() as eng:
            res = eng.load(merged, queries=["select count(*) as n from flow"])
            check(
                res.ok and res.error_stats == (), f"Perfetto loads it with no import error {res.error_stats}"
            )
    print("ALL CHECKS PASSED" if not FAILED else f"{len(FAILED)} CHECK(S) FAILED")
    return 0 if not FAILED else 1


if __name__ == "__main__":
    sys.exit(main())
