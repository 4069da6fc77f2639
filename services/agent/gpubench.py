"""Each CUDA GPU's dense matmul throughput, printed as one JSON line: run by the agent at start as a separate process
(it imports nothing of the project, so any Python with torch runs it; the CUDA context ends with it).

    python gpubench.py [--n 8192] [--seconds 1.0]

prints {"gpus": [{"index": 0, "tflops": 712.3, "dtype": "bfloat16", "n": 8192}, ...]} or {"gpus": [], "error": ...};
it exits 0 either way (a machine without torch or CUDA is an answer, not a failure)."""

import argparse
import json
import math
import sys
import time
from typing import Any

FREE_AT_LEAST = 0.9  # a GPU with less of its memory free is in use (a running task's): not measured, not disturbed
WARMUP = 3


def measure(torch: Any, index: int, *, n: int, seconds: float) -> dict:
    """One GPU: C = A @ B of n x n, warmed up, then timed for about `seconds`; 2 n^3 flops each."""
    device = torch.device("cuda", index)
    free, total = torch.cuda.mem_get_info(device)
    if free < FREE_AT_LEAST * total:
        return {"index": index, "error": f"busy: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        try:
            return {
                "index": index,
                "dtype": str(dtype).removeprefix("torch."),
                "n": n,
                "tflops": _timed(torch, device, dtype, n=n, seconds=seconds),
            }
        except (RuntimeError, TypeError) as exc:  # no kernel for the type on this GPU, or out of memory
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
            torch.cuda.empty_cache()
    return {"index": index, "error": error}


def _timed(torch: Any, device: Any, dtype: Any, *, n: int, seconds: float) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(WARMUP):
        torch.matmul(a, b)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    torch.matmul(a, b)
    torch.cuda.synchronize(device)
    once = max(time.perf_counter() - start, 1e-6)
    iters = max(5, min(10_000, math.ceil(seconds / once)))
    start = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b)
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    del a, b
    torch.cuda.empty_cache()
    return round(2 * n**3 * iters / elapsed / 1e12, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        return _answer({"gpus": [], "error": "no CUDA: torch is not installed in this Python"})
    if not torch.cuda.is_available():
        return _answer({"gpus": [], "error": "no CUDA: torch finds no CUDA device"})
    gpus = [measure(torch, i, n=args.n, seconds=args.seconds) for i in range(torch.cuda.device_count())]
    return _answer({"gpus": gpus})


def _answer(result: dict) -> int:
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
