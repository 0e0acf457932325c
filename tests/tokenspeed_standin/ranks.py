"""One scheduler rank of the stand-in: the REAL TokenSpeed profiler around a tiny CPU model.

Each rank is a spawned process (like TokenSpeed's scheduler processes) that serves commands from the
engine over a pipe, one at a time:

- ``generate``: sampled decoding with the tiny Qwen2 (one forward per token = one scheduler batch:
  ``forward_ct += 1`` then ``_profile_batch_predicate()``, as TokenSpeed's event loop does), every
  attention and MLP block inside a Proton ``kernel_scope``;
- ``profile``: a real ``ProfileReq`` handed to the real ``RequestHandler.profile``;
- ``init_group`` / ``update``: joins the trainer's gloo weight group the way
  ``ModelRunner.init_weights_update_group`` does (rendezvous + ``_new_process_group_helper``, with
  TokenSpeed's own ``_no_default_group_split`` / ``_assert_not_split``), receives each tensor with
  ``broadcast(src=0)`` in request order, loads it, and logs a sha256 per request
  (``weights-TP<rank>.jsonl`` in ``TOKENSPEED_STANDIN_LOG_DIR``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def checksum(items: list[tuple[str, Any]]) -> str:
    """sha256 over names and raw tensor bytes, in order (the test's sender computes the same)."""
    import torch

    h = hashlib.sha256()
    for name, tensor in items:
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Rank:
    def __init__(self, rank: int, tp: int, model_path: str) -> None:
        import torch
        from tokenspeed.runtime.engine.request_handler import RequestHandler, _profile_rank_tag
        from transformers import AutoModelForCausalLM

        from . import proton_standin

        torch.set_num_threads(1)
        self.rank, self.tp = rank, tp
        self.torch = torch
        h = RequestHandler.__new__(RequestHandler)  # only its profiler: the rest needs a GPU
        h.init_profiler()
        h.forward_ct, h.attn_tp_size, h._device = 0, 1, None
        h.server_args = SimpleNamespace(enable_eplb=False)
        h.profile_rank_tag = _profile_rank_tag(SimpleNamespace(has_dp=False, dp_rank=0, tp_rank=rank))
        self.handler = h
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.eos = self.model.config.eos_token_id
        for i, layer in enumerate(self.model.model.layers):
            for part, family in ((layer.self_attn, "attention"), (layer.mlp, "gemm")):
                self._scoped(part, family, f"layer{i}")
        self.scope = proton_standin.kernel_scope
        self.group: Any = None
        self.log_dir = Path(os.environ.get("TOKENSPEED_STANDIN_LOG_DIR") or ".")

    def _scoped(self, module: Any, family: str, where: str) -> None:
        from . import proton_standin

        forward = module.forward

        def scoped_forward(*args: Any, **kwargs: Any) -> Any:
            with proton_standin.kernel_scope(family, "forward", f"cpu_{where}"):
                return forward(*args, **kwargs)

        module.forward = scoped_forward

    # ------------------------------------------------------------------------------ work
    def forward_batch(self, ids: list[int]) -> Any:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0, -1]
        self.handler.forward_ct += 1
        self.handler._profile_batch_predicate()  # start_step / num_steps windows, as the event loop
        return self.torch.log_softmax(logits.float(), dim=-1)

    def generate(self, rid: str, ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        rng = random.Random(rid)
        temperature = float(params.get("temperature", 1.0) or 0.0)
        stop = set(params.get("stop_token_ids") or []) | {self.eos}
        out, logprobs, reason = [], [], "length"
        for _ in range(int(params.get("max_new_tokens", 16))):
            lp = self.forward_batch(ids + out)
            if temperature > 0:
                probs = self.torch.softmax(lp / temperature, dim=-1).tolist()
                token = rng.choices(range(len(probs)), weights=probs)[0]
            else:
                token = int(lp.argmax())
            out.append(token)
            logprobs.append(float(lp[token]))
            if token in stop:
                reason = "stop"
                break
        return {"output_ids": out, "logprobs": logprobs, "finish": reason}

    def profile(self, req: Any) -> tuple[bool, str]:
        res = self.handler.profile(req)
        return bool(res.success), str(res.message)

    def init_group(self, body: dict[str, Any]) -> tuple[bool, str]:
        from tokenspeed.runtime.execution.weight_update_group import (
            _assert_not_split,
            _no_default_group_split,
        )
        from torch.distributed.distributed_c10d import (
            Backend,
            PrefixStore,
            _new_process_group_helper,
            _world,
            default_pg_timeout,
            rendezvous,
        )

        rank = int(body["rank_offset"]) + self.rank
        init = f"tcp://{body['master_address']}:{int(body['master_port'])}"
        store, rank, size = next(rendezvous(init, rank, int(body["world_size"]), timeout=default_pg_timeout))
        store = PrefixStore(str(body["group_name"]), store)
        with _no_default_group_split():
            pg, _ = _new_process_group_helper(
                size,
                rank,
                [],
                Backend(str(body["backend"])),
                store,
                group_name=str(body["group_name"]),
                backend_options=None,
                timeout=default_pg_timeout,
            )
        _world.pg_group_ranks[pg] = {i: i for i in range(size)}
        _assert_not_split(pg, self.torch.device("cpu"))
        self.group = pg
        return True, f"weight update group joined: rank={rank} world_size={size}"

    def update(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], version: Any
    ) -> tuple[bool, str]:
        import torch.distributed as dist

        if self.group is None:
            return False, "weight update group not initialized"
        params = self.model.state_dict(keep_vars=True)  # tied weights under every name
        got, loaded = [], 0
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            buf = self.torch.empty(shape, dtype=getattr(self.torch, dtype))
            dist.broadcast(buf, src=0, group=self.group)
            got.append((name, buf))
            if name in params and tuple(params[name].shape) == tuple(shape):
                params[name].data.copy_(buf)
                loaded += 1
        line = {
            "rank": self.rank,
            "version": version,
            "names": names,
            "loaded": loaded,
            "sha256": checksum(got),
        }
        with open(self.log_dir / f"weights-TP{self.rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return True, f"updated {len(names)} weights"


def main(rank: int, tp: int, model_path: str, conn: Any) -> None:
    """Spawned process entry: install the kernel stubs, build the rank, serve commands until EOF."""
    from . import kernel_stubs

    kernel_stubs.install()
    parent = os.getppid()
    worker = Rank(rank, tp, model_path)
    conn.send(("ready", os.getpid()))
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent:  # the server died: so do its schedulers
                return
            continue
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind, args = msg[0], msg[1:]
        try:
            if kind == "generate":
                result: Any = worker.generate(*args)
            elif kind == "profile":
                result = worker.profile(*args)
            elif kind == "init_group":
                result = worker.init_group(*args)
            elif kind == "update":
                result = worker.update(*args)
            elif kind == "exit":
                return
            else:
                result = (False, f"unknown command {kind}")
            conn.send(("ok", result))
        except Exception as exc:  # reported to the engine, which answers like TokenSpeed would
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
