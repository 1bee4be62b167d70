"""``python -m labkit.model.trace_main`` (specs on stdin): the fresh process ``labkit.model.trace_runner`` starts, which
enables fake CUDA before anything imports torch, then runs ``labkit.model.memory_trace.main``."""

from labkit.model import fake_cuda

if __name__ == "__main__":
    fake_cuda.enable()
    from labkit.model.memory_trace import main

    main()
