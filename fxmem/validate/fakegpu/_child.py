"""Runs inside the subprocess (a CUDA-build Python with the fake-GPU stub preloaded).

Kept free of fxmem imports so that any CUDA build of PyTorch can run it. Reads one JSON
object from argv[1]: ``target`` ("module:function" or "path/to/file.py:function"),
``kwargs`` for that function, ``sys_path`` (extra import folders), ``steps`` (warm-up steps
before the measured one), ``memory_fraction`` (optional: ``set_per_process_memory_fraction``
first, a card that small). The function returns ``(model, inputs, targets, loss_fn,
optimizer_factory)``:

- ``inputs``: a tensor, a tuple/list of tensors (positional) or a dict (keyword arguments);
- ``targets``: a tensor, a tuple of tensors, or None;
- ``loss_fn(output, *targets)``, or None: the output's ``.loss`` (HF models given labels),
  else the output itself (a scalar);
- ``optimizer_factory(params)``, or None for no optimizer step.

With ``"jobs"`` (a list of objects with ``target``, ``kwargs``, ``steps`` and
``memory_fraction``) instead of a ``target``, each job's step is measured in turn, the
process set back between them as a fresh one starts (:func:`_release`); the figures are a
list, under ``"steps"``.

With ``"call": true`` the function is instead called with ``kwargs`` and what it returns
(JSON-able) is the result, under ``"value"``: for probes of single ops.

With ``"rank"``, ``"world_size"`` and ``"init_method"`` (one rank of a parallel run started
by :mod:`fxmem.validate.fakegpu.ranks`), the process joins a ``"backend"`` (default NCCL:
the stub's) process group first and leaves it after the target returns.

Prints one line ``FAKEGPU_RESULT {json}``.
"""

import gc
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback


def _load(target):
    mod_name, _, fn_name = target.rpartition(":")
    if not mod_name or not fn_name:
        raise ValueError(f"target must be 'module:function' or 'file.py:function', got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name:
        spec = importlib.util.spec_from_file_location("_fakegpu_target", mod_name)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_fakegpu_target"] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    return getattr(mod, fn_name)


def _to(obj, device):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def zeroed_blocks() -> bool:
    """Every block PyTorch's caching allocator hands out reads as zero until the host writes
    it, whatever it held before (stub.c ``fakegpu_block_zero``): ``alloc_hook.cpp``'s
    library, built beside the stub (``FAKEGPU_ALLOC_HOOK``), adds a trace tracker to the
    allocator that zeroes each allocation. After CUDA's lazy init, before any allocation;
    False when there is no such library."""
    import ctypes

    import torch

    path = os.environ.get("FAKEGPU_ALLOC_HOOK")
    if not path or not os.path.isfile(path):
        return False
    torch.cuda.init()
    return bool(ctypes.CDLL(path).fakegpu_attach())


def run_module(module, args):
    """``python -m module *args`` with :func:`zeroed_blocks` first."""
    import runpy

    zeroed_blocks()
    sys.path[0] = os.getcwd()  # as ``-m`` has it, not this file's folder
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _measure(fn, cfg) -> dict:
    """One step of ``fn``'s model measured as the module docstring says: its figures."""
    import torch

    figures = {}
    model, inputs, targets, loss_fn, opt_factory = fn(**cfg.get("kwargs", {}))
    if cfg.get("memory_fraction") is not None:  # a smaller card: the allocator's limit
        torch.cuda.set_per_process_memory_fraction(cfg["memory_fraction"])
    dev = "cuda"
    model = model.to(dev)
    inputs = _to(inputs, dev)
    targets = _to(targets, dev)
    if targets is None:
        targets = ()
    elif not isinstance(targets, (tuple, list)):
        targets = (targets,)
    opt = opt_factory(list(model.parameters())) if opt_factory is not None else None
    params = list(model.parameters())

    def step():
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        if isinstance(inputs, dict):
            out = model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            out = model(*inputs)
        else:
            out = model(inputs)
        if loss_fn is not None:
            loss = loss_fn(out, *targets)
        else:
            loss = getattr(out, "loss", None)
            if loss is None:
                loss = out[0] if isinstance(out, (tuple, list)) else out
        del out
        loss.backward()
        if opt is not None:  # the loss stays alive through it, as in a usual loop
            opt.step()
        del loss

    t0 = time.time()
    for _ in range(int(cfg.get("steps", 1))):
        step()
    # steady state: gradients gone (as zero_grad(set_to_none=True) at the next step's
    # start leaves them), optimizer state present
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    figures["baseline_allocated"] = torch.cuda.memory_allocated()
    figures["baseline_reserved"] = torch.cuda.memory_reserved()
    step()
    torch.cuda.synchronize()
    figures["max_allocated"] = torch.cuda.max_memory_allocated()
    figures["max_reserved"] = torch.cuda.max_memory_reserved()
    figures["end_allocated"] = torch.cuda.memory_allocated()
    figures["end_reserved"] = torch.cuda.memory_reserved()
    figures["device_name"] = torch.cuda.get_device_name()
    figures["seconds"] = round(time.time() - t0, 3)
    return figures


def _release(cfg) -> None:
    """After a measured step, the process as a fresh one starts the next: nothing of the
    step left (its tensors collected, the cuBLAS workspaces it kept let go, every cached
    segment returned), the peaks reset and the allocator's limit lifted."""
    import torch

    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    if cfg.get("memory_fraction") is not None:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.reset_peak_memory_stats()


class _Done(Exception):
    """A ``call`` target returned: its value is the result."""


def main():
    cfg = json.loads(sys.argv[1])
    for p in reversed(cfg.get("sys_path", [])):
        sys.path.insert(0, p)
    import torch

    result = {"torch": torch.__version__, "zeroed_blocks": zeroed_blocks()}
    dist = None
    try:
        if cfg.get("world_size") is not None:
            import datetime

            import torch.distributed as dist

            torch.cuda.set_device(0)
            dist.init_process_group(cfg.get("backend", "nccl"), init_method=cfg["init_method"],
                                    rank=cfg["rank"], world_size=cfg["world_size"],
                                    timeout=datetime.timedelta(seconds=cfg.get("timeout", 300)))
        fn = _load(cfg["target"]) if cfg.get("target") else None
        # what the imports made and kept, out of the cyclic collector's way: the full
        # collections around each measured step then walk only what the steps made (each
        # took about half a second over torch's own objects)
        gc.collect()
        gc.freeze()
        if cfg.get("call"):
            result["value"] = fn(**cfg.get("kwargs", {}))
            raise _Done
        if cfg.get("jobs") is not None:  # several steps, each measured in turn
            result["steps"] = []
            for job in cfg["jobs"]:
                result["steps"].append(_measure(_load(job["target"]), job))
                _release(job)
                # what the step's own imports made and kept (transformers', imported as a
                # model is built) out of the next steps' collections too: nothing of the
                # step is left to freeze, _release collected it
                gc.freeze()
            raise _Done
        result.update(_measure(fn, cfg))
    except _Done:
        pass
    except BaseException as e:  # report, don't crash without a result line
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    print("FAKEGPU_RESULT " + json.dumps(result), flush=True)


def dispatch(args) -> None:
    """What the command line ``_child.py *args`` does (``sys.argv`` already set to it):
    ``--module MODULE *ARGS`` runs a module as ``-m`` does, else one JSON object."""
    if args[0] == "--module":
        run_module(args[1], args[2:])
    else:
        main()


if __name__ == "__main__":
    dispatch(sys.argv[1:])
