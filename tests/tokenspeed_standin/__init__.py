"""A CPU stand-in for ``tokenspeed serve`` (tokenspeed 0.1.1), for tests: NOT the real server.

TokenSpeed's runtime needs a GPU (``tokenspeed_kernel`` refuses to import without one), its gateway
is a Rust binary and Proton needs CUPTI. What can run on a CPU runs for real here, in its own
virtual environment (``.venv-tokenspeed``: TokenSpeed pins transformers 5.12.0, VERL 0.9.1 < 5.11):

- the real control server (``control_server.build_control_server``) on ``--control-port``: every
  request of the ``tokenspeed`` rollout goes through it, exactly as in production (``/generate``
  single-prompt unwrap, ``/health`` passthrough, RL routes proxied to the engine's RL app);
- the real RL control app (``sglang_compat_http.build_sglang_compat_app``), which parses and
  validates every weight-sync, memory and abort request with TokenSpeed's own request models, over
  a stand-in ``AsyncLLM`` (:mod:`.engine`);
- the real scheduler profiler (``RequestHandler.init_profiler/profile/_profile_batch_predicate``)
  in every scheduler rank process, fed the real ``ProfileReq`` built by the real
  ``SchedulerControlClient.start_profile``: it names and writes the real VizTracer reports.

What is replaced: the gateway (:mod:`.gateway`: it drops ``profile_id`` as smg does), the three GPU
kernel packages (empty stand-ins, :mod:`.kernel_stubs`), Proton (:mod:`.proton_standin` writes
``chrome_trace`` files in Proton's format, marked ``"synthetic"``, and TokenSpeed's
``viztracer->proton`` flow starts) and the model runner (a tiny Qwen2 on CPU, :mod:`.ranks`, which
joins the gloo weight group like ``ModelRunner.init_weights_update_group`` and logs a checksum of
every received bucket).

Run: ``.venv-tokenspeed/bin/python -m tests.tokenspeed_standin serve --model DIR --tp N --port P
--control-port C [--enable-output-logprobs] [--enable-memory-saver] ...`` (with the repository root
and ``src`` on ``PYTHONPATH``).
"""
